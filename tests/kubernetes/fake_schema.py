"""What kube-apiserver does with a custom resource's body before storing it, from the CRD's openAPIV3Schema.

In the API server's order: prune the fields the structural schema does not declare (unless
`x-kubernetes-preserve-unknown-fields`) and the nulls of fields that are not `nullable`, apply `default`s,
validate (types, `nullable`, enums, bounds, lengths, patterns, item and property counts, `required`), then
evaluate every `x-kubernetes-validations` CEL rule with `self` bound to its node (cel-python). A failure
is a 422 with one cause per field, as the real server answers; the fake stores only what passed.

Left out on purpose (not used by manifests/crd.yaml): transition rules (`oldSelf`), `format` other than
date-time, `x-kubernetes-int-or-string`, `allOf`/`anyOf` (a structural schema has none anyway).
"""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import celpy

_PRESERVE = "x-kubernetes-preserve-unknown-fields"
_ROOT_KEYS = ("apiVersion", "kind", "metadata")  # never pruned: the API server owns them


@dataclass(frozen=True)
class Cause:
    field: str
    message: str


def prune(value: Any, schema: dict[str, Any]) -> Any:
    """`value` without what the schema does not declare (structural pruning)."""
    if isinstance(value, dict) and schema.get("type") == "object":
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        result = {}
        for key, child in value.items():
            declared = properties.get(key) if properties is not None else None
            if child is None and declared is not None and not declared.get("nullable"):
                continue  # a null where the schema does not allow one is dropped (then defaulted), not refused
            if declared is not None:
                result[key] = prune(child, declared)
            elif isinstance(extra, dict):
                result[key] = prune(child, extra)
            elif schema.get(_PRESERVE) or (properties is None and extra is None):
                result[key] = child
        return result
    if isinstance(value, list) and schema.get("type") == "array" and "items" in schema:
        return [prune(item, schema["items"]) for item in value]
    return value


def prune_object(obj: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    pruned = prune({k: v for k, v in obj.items() if k not in _ROOT_KEYS}, schema)
    return {**{k: obj[k] for k in _ROOT_KEYS if k in obj}, **pruned}


def apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """Fill in `default`s of missing (or null, where not nullable) properties, recursively."""
    if isinstance(value, dict) and schema.get("type") == "object":
        result = dict(value)
        for key, child in (schema.get("properties") or {}).items():
            missing = key not in result or (result[key] is None and not child.get("nullable"))
            if missing and "default" in child:
                result[key] = copy.deepcopy(child["default"])
            if key in result:
                result[key] = apply_defaults(result[key], child)
        return result
    if isinstance(value, list) and "items" in schema:
        return [apply_defaults(item, schema["items"]) for item in value]
    return value


_TYPES = {
    "object": dict, "array": list, "string": str, "boolean": bool,
    "integer": int, "number": (int, float),
}  # fmt: skip


def validate(value: Any, schema: dict[str, Any], path: str = "") -> list[Cause]:
    """Every violation, each naming the field as the API server does (`spec.replicas`)."""
    if value is None:
        return (
            []
            if schema.get("nullable") or schema.get(_PRESERVE)
            else [Cause(path, f'{path} in body must be of type {schema.get("type")}: "null"')]
        )
    kind = schema.get("type")
    expected = _TYPES.get(kind) if kind else None
    if expected is not None and (
        not isinstance(value, expected) or (kind in ("integer", "number") and isinstance(value, bool))
    ):
        return [Cause(path, f'{path} in body must be of type {kind}: "{type(value).__name__}"')]
    causes: list[Cause] = []
    if "enum" in schema and value not in schema["enum"]:
        causes.append(Cause(path, f"Unsupported value: {value!r}: supported values: {schema['enum']}"))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            causes.append(Cause(path, f"{path} in body should be greater than or equal to {schema['minimum']}"))
        if "maximum" in schema and value > schema["maximum"]:
            causes.append(Cause(path, f"{path} in body should be less than or equal to {schema['maximum']}"))
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            causes.append(Cause(path, f"{path} in body should be at least {schema['minLength']} chars long"))
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            causes.append(Cause(path, f"Too long: may not be more than {schema['maxLength']} bytes"))
        if "pattern" in schema and not re.search(schema["pattern"], value):
            causes.append(Cause(path, f"{path} in body should match '{schema['pattern']}'"))
        if schema.get("format") == "date-time" and not _is_date_time(value):
            causes.append(Cause(path, f"{path} in body must be of type date-time: {value!r}"))
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            causes.append(Cause(path, f"{path} in body should have at least {schema['minItems']} items"))
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            causes.append(Cause(path, f"Too many: {len(value)}: must have at most {schema['maxItems']} items"))
        for index, item in enumerate(value):
            causes += validate(item, schema.get("items") or {}, f"{path}[{index}]")
    if isinstance(value, dict):
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            causes.append(Cause(path, f"Too many: {len(value)}: must have at most {schema['maxProperties']} items"))
        for key in schema.get("required") or []:
            if key not in value:
                causes.append(Cause(_join(path, key), "Required value"))
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, child in value.items():
            if key in properties:
                causes += validate(child, properties[key], _join(path, key))
            elif isinstance(extra, dict):
                causes += validate(child, extra, _join(path, key))
    if not causes:
        causes += _cel(value, schema, path)
    return causes


def _cel(value: Any, schema: dict[str, Any], path: str) -> list[Cause]:
    causes = []
    for validation in schema.get("x-kubernetes-validations") or []:
        program = _compile(validation["rule"])
        try:
            result = program.evaluate({"self": celpy.json_to_cel(value)})
        except celpy.CELEvalError as err:
            causes.append(Cause(path, f"Invalid value: rule {validation['rule']!r} failed to evaluate: {err}"))
            continue
        if isinstance(result, celpy.CELEvalError) or not bool(result):
            message = validation.get("message") or f"failed rule: {validation['rule']}"
            causes.append(Cause(path, f"Invalid value: {message}"))
    return causes


@functools.cache
def _compile(rule: str) -> celpy.Runner:
    environment = celpy.Environment()
    return environment.program(environment.compile(rule))


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _is_date_time(text: str) -> bool:
    try:
        datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def admit(
    obj: dict[str, Any], schema: dict[str, Any], *, only: str | None = None
) -> tuple[dict[str, Any], list[Cause]]:
    """Prune, default and validate a whole object (or, with `only="status"`, its status alone)."""
    defaulted = apply_defaults(prune_object(obj, schema), schema)
    if only is None:
        return defaulted, validate(defaulted, schema)
    part = {only: defaulted[only]} if only in defaulted else {}
    return defaulted, validate(part, {"type": "object", "properties": {only: schema["properties"][only]}})
