"""Turn pydantic's validation errors into one line per problem that a user can act on.

A raw pydantic dump names Python types and snake_case internals; users wrote camelCase YAML. Each line
here is `<path as written>: <bad value> <what is wrong>; <how to fix it>`, e.g.
`spec.worker.comand: unknown field; did you mean 'command'?`.
"""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Sequence
from enum import Enum
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from elastic.errors import PermanentError
from elastic.spec.excerpt import cut, show
from elastic.spec.model import ElasticJob
from elastic.spec.process_text import text_problem

_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")
# A document with thousands of bad items gets the first ones and a count, not thousands of lines.
MAX_SHOWN_PROBLEMS = 20
# Words longer than this are not misspellings of a field or an enum value: no guess.
_MAX_GUESS_CHARS = 40


class SpecError(PermanentError, ValueError):
    """An ElasticJob document is invalid. `problems` holds one user-facing line per problem."""

    def __init__(self, problems: Sequence[str], source: str | None = None) -> None:
        self.problems: list[str] = list(problems)
        self.source = source
        super().__init__(self._render())

    def _render(self) -> str:
        where = f"{self.source}: " if self.source else ""
        if len(self.problems) == 1:
            return f"{where}{self.problems[0]}"
        lines = [f"{where}{len(self.problems)} problems in the ElasticJob"]
        lines += [f"  - {line}" for line in self.problems[:MAX_SHOWN_PROBLEMS]]
        if len(self.problems) > MAX_SHOWN_PROBLEMS:
            lines.append(f"  ... and {len(self.problems) - MAX_SHOWN_PROBLEMS} more; fix these first")
        return "\n".join(lines)


def format_path(loc: Sequence[str | int]) -> str:
    """('spec', 'failurePolicy', 'rules', 0, 'action') -> 'spec.failurePolicy.rules[0].action'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            out += f".{cut(part)}" if out else cut(part)
        else:  # a map key such as a label 'app.kubernetes.io/name'
            out += f"[{show(part)}]"
    return out or "(document)"


def problems_from(error: ValidationError) -> list[str]:
    """One line per pydantic error, in document order."""
    return [_describe(detail) for detail in error.errors(include_url=False)]


def _unwrap(tp: Any) -> Any:
    """Strip Annotated[...] and Optional[...] to reach the type the user's value must have."""
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
        elif origin in (Union, types.UnionType):
            rest = [arg for arg in get_args(tp) if arg is not type(None)]
            if len(rest) != 1:
                return tp
            tp = rest[0]
        else:
            return tp


def _field(model: type[BaseModel], key: str) -> Any:
    for name, info in model.model_fields.items():
        if key in (name, info.alias):
            return info.annotation
    return None


def type_at(loc: Sequence[str | int], root: type[BaseModel] = ElasticJob) -> Any:
    """The declared type at a path of the document, or None when the path leaves the model."""
    tp: Any = root
    for part in loc:
        tp = _unwrap(tp)
        origin = get_origin(tp)
        if isinstance(part, int) and origin in (list, tuple):
            tp = get_args(tp)[0]
        elif isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(part, str):
            tp = _field(tp, part)
            if tp is None:
                return None
        elif origin is dict:
            tp = get_args(tp)[1]
        else:
            return None
    return _unwrap(tp)


def _known_keys(loc: Sequence[str | int]) -> list[str]:
    model = type_at(loc)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return [info.alias or name for name, info in model.model_fields.items()]
    return []


def _closest(word: Any, choices: Sequence[str]) -> str | None:
    """Best guess for a misspelling; compares case-insensitively so 'onfailure' finds 'OnFailure'."""
    if not isinstance(word, str) or len(word) > _MAX_GUESS_CHARS:
        return None
    by_lower = {choice.lower(): choice for choice in choices}
    found = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[found[0]] if found else None


def _unknown_field(loc: Sequence[str | int]) -> str:
    known = _known_keys(loc[:-1])
    guess = _closest(loc[-1], known)
    if guess:
        return f"unknown field; did you mean {guess!r}?"
    if known:
        return f"unknown field; remove it (allowed here: {', '.join(known)})"
    return "unknown field; remove it"


def _not_in_enum(loc: Sequence[str | int], value: Any, ctx: dict[str, Any]) -> str:
    enum = type_at(loc)
    if isinstance(enum, type) and issubclass(enum, Enum):
        allowed = [str(member.value) for member in enum]
    else:
        allowed = [part.strip(" '") for part in re.split(r",| or ", str(ctx.get("expected", "")))]
    text = f"{show(value)} is not one of {', '.join(allowed)}"
    guess = _closest(value, allowed)
    return f"{text}; did you mean {guess!r}?" if guess else text


def _not_a_list(value: Any) -> str:
    if isinstance(value, str) and value.split() and len(value) <= _MAX_GUESS_CHARS:
        return f"{show(value)} is not a list; write it as a list, e.g. {value.split()!r}"
    return f"{show(value)} is not a list; write a YAML list ('- item' per line, or [a, b])"


def _number(bound: float) -> str:
    """A bound as written in a spec: 2147483647, not 2.14748e+09; 0.5 stays 0.5."""
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def _describe(detail: ErrorDetails) -> str:
    loc = list(detail["loc"])
    kind = detail["type"]
    value = detail.get("input")
    ctx: dict[str, Any] = dict(detail.get("ctx") or {})
    if kind == "elastic_spec":
        field = ctx.get("field")
        if loc and loc[-1] == "[key]":  # pydantic's marker for a bad mapping key; the text says it is the key
            loc.pop()
        if field:
            loc.extend(field if isinstance(field, tuple) else [field])
        return f"{format_path(loc)}: {ctx['problem']}"
    path = format_path(loc)
    if kind == "missing":
        parent = format_path(loc[:-1]) if len(loc) > 1 else "the document"
        return f"{path}: required field is missing; add {show(loc[-1])} to {parent}"
    if kind == "extra_forbidden":
        return f"{path}: {_unknown_field(loc)}"
    if kind == "literal_error":
        expected = str(ctx.get("expected", "")).strip("'")
        return f"{path}: {show(value)} is not {expected!r}; set {loc[-1]}: {expected}"
    if kind == "enum":
        return f"{path}: {_not_in_enum(loc, value, ctx)}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"{path}: {show(value)} is not an integer; write a whole number without quotes, e.g. 3"
    if kind == "finite_number":
        return f"{path}: {show(value)} is not a finite number; write a number such as 2.5"
    if kind in ("float_type", "float_parsing"):
        return f"{path}: {show(value)} is not a number; write a number without quotes, e.g. 2.5"
    if kind == "string_type":
        if isinstance(value, (int, float, bool)):
            return f'{path}: {show(value)} is not a string; quote it, e.g. "{show(value)}"'
        return f"{path}: {show(value)} is not a string; write a single string value"
    if kind == "list_type":
        return f"{path}: {_not_a_list(value)}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        under = cut(str(loc[-1])) if loc else "it"
        return f"{path}: {show(value)} is not a mapping; write 'key: value' pairs under {under}"
    if kind == "greater_than_equal":
        return f"{path}: {show(value)} is less than {_number(ctx['ge'])}; set it to {_number(ctx['ge'])} or more"
    if kind == "less_than_equal":
        return f"{path}: {show(value)} is greater than {_number(ctx['le'])}; set it to {_number(ctx['le'])} or less"
    if kind == "too_short":
        need = ctx.get("min_length", 1)
        return f"{path}: {show(value)} is empty; give at least {need} item{'s' if need != 1 else ''}"
    if kind == "string_unicode" and isinstance(value, str):  # a lone surrogate, met by pydantic's own check
        return f"{path}: {text_problem(value) or 'is not valid Unicode text; remove the odd character'}"
    if kind == "string_too_short":
        return f"{path}: {show(value)} is empty; write a non-empty string or remove the entry"
    if kind == "string_too_long":
        return f"{path}: {show(value)} is too long; shorten it to {ctx.get('max_length')} characters or fewer"
    # A kind this table does not know yet: still one line, in the user's words as far as pydantic has them.
    return f"{path}: {show(value)} is invalid: {cut(detail['msg'], 200)}"
