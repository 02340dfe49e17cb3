"""Read an ElasticJob from a YAML/JSON file, a YAML string or an already-parsed mapping.

Every way a document can be wrong (unreadable file, YAML syntax, a list instead of a mapping, a bad field)
ends in one `SpecError` whose lines say where and how to fix it, so the CLI can print it as is.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import ValidationError

from elastic.spec.excerpt import cut, show
from elastic.spec.model import API_VERSION, KIND, ElasticJob
from elastic.spec.problems import SpecError, problems_from

_SHAPE = f"an ElasticJob is a mapping with apiVersion: {API_VERSION}, kind: {KIND}, metadata and spec"


# Bad input has limits. An ElasticJob is a few hundred values a few levels deep; these bounds are far
# above that and far below what makes parsing slow: 1 MiB (the most Kubernetes stores in one ConfigMap
# or Secret), MAX_VALUES values once aliases are expanded (a 'billion laughs' document is a few hundred
# bytes that expand to 10^9 values), MAX_DEPTH levels of nesting (deeper recursion overflows Python's
# stack in every later walk of the value: validation, JSON, repr).
MAX_FILE_BYTES = 1 << 20
MAX_VALUES = 10_000
MAX_DEPTH = 64

_TOO_BIG = (
    f"the document is larger than {MAX_FILE_BYTES >> 20} MiB, the most an ElasticJob may be (as Kubernetes caps "
    "a ConfigMap); a job needs a few KiB: keep data out of the spec"
)
_TOO_DEEP = f"the document nests more than {MAX_DEPTH} levels deep; flatten it"
_INT, _FLOAT, _STR = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:str"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_AMBIGUOUS_NUMBER = re.compile(r"[:_]|^[-+]?0[0-7]+$|^[-+]?0b")

# libyaml's parser produces the events ~5x faster than PyYAML's Python one; composing them stays in Python
# (_JobComposer comes before the parser in _JobLoader's bases) so that the limits are checked as the
# document is read. Both parsers give the same events.
if yaml.__with_libyaml__:
    from yaml._yaml import CParser as _Parser
else:  # pragma: no cover - PyYAML built without libyaml

    class _Parser(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser):  # type: ignore[no-redef]
        def __init__(self, stream: str) -> None:
            yaml.reader.Reader.__init__(self, stream)
            yaml.scanner.Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)


class _LimitError(yaml.MarkedYAMLError):
    """The document passes a size limit at this mark; `problem` is a complete user-facing sentence."""


class _DuplicateKeyError(yaml.MarkedYAMLError):
    pass


class _JobComposer(yaml.composer.Composer):
    """A Composer that knows, for every node, how big and how deep it is once aliases are expanded.

    Composition itself is linear (an alias reuses its anchor's node), but every later walk of the value
    is not, so the expanded size is counted here, before a single Python object is built: each new node
    adds 1, each alias adds its anchor's expanded size. An alias inside its own anchor is a cycle.
    """

    def __init__(self) -> None:
        super().__init__()
        self._shapes: dict[yaml.Node, tuple[int, int]] = {}  # node -> (expanded values, expanded depth)
        self._values = 0
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            target = self.anchors.get(event.anchor)
            if target is not None:  # an undefined alias: the Composer names it
                shape = self._shapes.get(target)
                if shape is None:
                    raise _LimitError(
                        problem=f"alias *{event.anchor} is inside its own anchor &{event.anchor} (a cycle); "
                        "repeat the content instead",
                        problem_mark=event.start_mark,
                    )
                self._grow(shape, event)
            return super().compose_node(parent, index)
        self._grow((1, 1), event)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        self._shapes[node] = self._shape_of(node)
        return node

    def _shape_of(self, node: yaml.Node) -> tuple[int, int]:
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        else:
            return 1, 1
        shapes = [self._shapes[child] for child in children]
        return 1 + sum(size for size, _ in shapes), 1 + max((depth for _, depth in shapes), default=0)

    def _grow(self, shape: tuple[int, int], event: yaml.Event) -> None:
        size, depth = shape
        self._values += size
        alias = f" (alias *{event.anchor} repeats all of &{event.anchor})" if isinstance(event, yaml.AliasEvent) else ""
        if self._values > MAX_VALUES:
            raise _LimitError(
                problem=f"the document holds more than {MAX_VALUES} values{alias}; an ElasticJob needs "
                "a few hundred: remove the repetition",
                problem_mark=event.start_mark,
            )
        if self._depth + depth > MAX_DEPTH:
            raise _LimitError(
                problem=_TOO_DEEP.replace(";", f"{alias};", 1),
                problem_mark=event.start_mark,
            )


class _JobResolver(yaml.resolver.Resolver):
    """YAML 1.1's implicit types, less those that read an ordinary-looking word as something else.

    In YAML 1.1 `1:30` is a base-60 integer (90), `0755` an octal one (493), `1_000` is 1000 and
    `2024-01-01` a date; YAML 1.2 reads them otherwise, and YAML tools disagree. Here they are strings:
    a string field keeps what was written, and a number field says that '1:30' is not a number instead of
    quietly taking 90. Plain decimal numbers, `0x1F`, `.5`, `1e3`, `.inf` read as before.
    """

    def resolve(self, kind: type, value: str | None, implicit: tuple[bool, bool]) -> str:
        tag = super().resolve(kind, value, implicit)
        if tag == _TIMESTAMP or (tag in (_INT, _FLOAT) and value is not None and _AMBIGUOUS_NUMBER.search(value)):
            return _STR
        return tag


class _JobLoader(_JobComposer, _Parser, yaml.constructor.SafeConstructor, _JobResolver):
    """SafeLoader's parts with the limits above; rejects duplicate keys (PyYAML keeps the last one
    silently, hiding half an edit) and turns a value Python cannot build into a marked error."""

    def __init__(self, stream: str) -> None:
        _Parser.__init__(self, stream)
        _JobComposer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        _JobResolver.__init__(self)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as err:  # `!!int x`, a 5000-digit integer, `!!timestamp 2024-13-45`
            raise yaml.constructor.ConstructorError(
                problem=f"{show(node.value)} cannot be read as {node.tag.rsplit(':', 1)[-1]} ({cut(str(err), 80)})",
                problem_mark=node.start_mark,
            ) from None


def _construct_mapping(loader: _JobLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.setdefault(key, key_node)
        except TypeError:  # an unhashable key; construct_mapping reports it
            continue
        if first is not key_node:
            raise _DuplicateKeyError(
                problem=f"duplicate key {show(key)} (first at line {first.start_mark.line + 1}); keep only one",
                problem_mark=key_node.start_mark,
            )
    return loader.construct_mapping(node, deep=True)


_JobLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _yaml_problem(err: yaml.YAMLError) -> str:
    if not isinstance(err, yaml.MarkedYAMLError) or err.problem_mark is None:
        return f"invalid YAML: {err}; fix the YAML syntax"
    where = f"line {err.problem_mark.line + 1}, column {err.problem_mark.column + 1}"
    if isinstance(err, (_DuplicateKeyError, _LimitError)):
        return f"{where}: {err.problem}"
    if err.problem == "exceeded maximum nesting depth":  # libyaml's own cap (1000), before ours is reached
        return f"{where}: {_TOO_DEEP}"
    if err.context == "expected a single document in the stream":
        return f"{where}: a second YAML document starts here; put one ElasticJob per file"
    context = f" ({err.context})" if err.context else ""
    return (
        f"{where}: {err.problem or 'invalid YAML'}{context}; "
        "fix the YAML syntax there (indentation, a space after ':', quotes around special characters)"
    )


def _read_yaml(text: str, source: str) -> Any:
    if len(text) > MAX_FILE_BYTES:  # characters, not bytes: a cheap first bound for text handed in directly
        raise SpecError([_TOO_BIG], source)
    try:
        return yaml.load(text, Loader=_JobLoader)  # SafeLoader's constructors: no arbitrary objects
    except yaml.YAMLError as err:
        raise SpecError([_yaml_problem(err)], source) from None


def parse_job(data: Mapping[str, Any] | str, *, source: str | None = None) -> ElasticJob:
    """Validate a mapping, or YAML/JSON text, as an ElasticJob; raise SpecError listing every problem."""
    if isinstance(data, str):
        data = _read_yaml(data, source or "<string>")
    if data is None:
        raise SpecError([f"the document is empty; {_SHAPE}"], source)
    if not isinstance(data, Mapping):
        raise SpecError([f"the document is a {type(data).__name__}, not a mapping; {_SHAPE}"], source)
    try:
        return ElasticJob.model_validate(dict(data))
    except ValidationError as err:
        raise SpecError(problems_from(err), source) from None


def load_job(path: str | os.PathLike[str]) -> ElasticJob:
    """Read and validate one ElasticJob file (YAML or JSON); errors name the file.

    At most MAX_FILE_BYTES + 1 bytes are read, whatever the file claims to be: /dev/zero, a pipe or a
    file still growing has no trustworthy size.
    """
    source = os.fspath(path)
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            raise SpecError([_TOO_BIG], source)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise SpecError([f"cannot read the file: {reason}; check the path"], source) from None
    return parse_job(text, source=source)
