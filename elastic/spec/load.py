"""Read an ElasticJob from a YAML/JSON file, a YAML string or an already-parsed mapping.

Every way a document can be wrong (unreadable file, YAML syntax, a list instead of a mapping, a bad field)
ends in one `SpecError` whose lines say where and how to fix it, so the CLI can print it as is.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from elastic.spec.model import API_VERSION, KIND, ElasticJob
from elastic.spec.problems import SpecError, problems_from

_SHAPE = f"an ElasticJob is a mapping with apiVersion: {API_VERSION}, kind: {KIND}, metadata and spec"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys: PyYAML keeps the last one silently, hiding half an edit."""


class _DuplicateKeyError(yaml.MarkedYAMLError):
    pass


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
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
                problem=f"duplicate key {key!r} (first at line {first.start_mark.line + 1}); keep only one",
                problem_mark=key_node.start_mark,
            )
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _yaml_problem(err: yaml.YAMLError) -> str:
    if not isinstance(err, yaml.MarkedYAMLError) or err.problem_mark is None:
        return f"invalid YAML: {err}; fix the YAML syntax"
    where = f"line {err.problem_mark.line + 1}, column {err.problem_mark.column + 1}"
    if isinstance(err, _DuplicateKeyError):
        return f"{where}: {err.problem}"
    if err.context == "expected a single document in the stream":
        return f"{where}: a second YAML document starts here; put one ElasticJob per file"
    context = f" ({err.context})" if err.context else ""
    return (
        f"{where}: {err.problem or 'invalid YAML'}{context}; "
        "fix the YAML syntax there (indentation, a space after ':', quotes around special characters)"
    )


def _read_yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
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
    """Read and validate one ElasticJob file (YAML or JSON); errors name the file."""
    source = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise SpecError([f"cannot read the file: {reason}; check the path"], source) from None
    return parse_job(text, source=source)
