"""Derive the CRD's `openAPIV3Schema` from the model, so the API server and `parse_job` agree.

Kubernetes accepts only *structural* schemas: every node has a type, no `$ref`, no type-changing
`anyOf`, `nullable: true` instead of a null type, `enum` instead of `const`, free-form objects marked
`x-kubernetes-preserve-unknown-fields`, and `metadata` restricted at most on its name. Pydantic's JSON
schema is close; this module rewrites the rest and fails loudly if the model grows something a CRD
cannot express.
"""

from __future__ import annotations

import copy
from typing import Any

from elastic.spec.model import ElasticJob
from elastic.spec.names import DNS1123_LABEL, JOB_NAME_MAX

_PRESERVE = "x-kubernetes-preserve-unknown-fields"
_DROPPED = ("title",)


def openapi_v3_schema(*, reject_unknown_fields: bool = False) -> dict[str, Any]:
    """The ElasticJob schema for a CRD version's `schema.openAPIV3Schema`.

    The API server prunes unknown fields, and a structural schema may not combine `properties` with
    `additionalProperties`, so by default unknown keys are not errors here. `reject_unknown_fields=True`
    adds `additionalProperties: false` (like `kubectl --validate=strict`) for offline checks with
    `jsonschema`; do not put that variant into a CRD.

    `jsonschema` ignores `nullable`, so an explicit `null` fails there though Kubernetes accepts it.
    """
    raw = ElasticJob.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    root = _structural(raw, defs, reject_unknown_fields)
    root.pop("description", None)
    properties = root["properties"]
    properties["apiVersion"]["description"] = "elastic.dev/v1alpha1"
    # The API server owns metadata; a CRD may only restrict the name.
    properties["metadata"] = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": JOB_NAME_MAX, "pattern": f"^{DNS1123_LABEL.pattern}$"}
        },
    }
    properties["status"] = {"type": "object", _PRESERVE: True}
    # The scale subresource reads spec.replicas as an int64: a stored null makes GET /scale fail (500), which
    # breaks `kubectl scale` and every HPA. Not nullable, the API server drops a null instead (unset: the
    # job's maxReplicas, and /scale reads 0 until someone scales it).
    properties["spec"]["properties"]["replicas"].pop("nullable", None)
    return root


def _structural(node: dict[str, Any], defs: dict[str, Any], closed: bool) -> dict[str, Any]:
    node = copy.deepcopy(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        node = {**copy.deepcopy(target), **node}
    if "anyOf" in node:
        variants = node.pop("anyOf")
        rest = [variant for variant in variants if variant.get("type") != "null"]
        if len(rest) != 1 or len(variants) != 2:
            raise ValueError(f"a CRD cannot express this union: {variants}")
        node = {**_structural(rest[0], defs, closed), **node, "nullable": True}
    for key in ("oneOf", "allOf", "not"):
        if key in node:
            raise ValueError(f"a CRD schema cannot use {key!r} here: {node}")
    for key in _DROPPED:
        node.pop(key, None)
    if "default" in node and node["default"] is None:
        del node["default"]
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if "properties" in node:
        node["properties"] = {name: _structural(child, defs, closed) for name, child in node["properties"].items()}
    if "items" in node:
        node["items"] = _structural(node["items"], defs, closed)
    extra = node.pop("additionalProperties", None)
    if isinstance(extra, dict):
        node["additionalProperties"] = _structural(extra, defs, closed)
    elif extra is False and closed:
        node["additionalProperties"] = False
    if node.get("type") == "object" and "properties" not in node and "additionalProperties" not in node:
        node[_PRESERVE] = True
    if "type" not in node and not node.get(_PRESERVE):
        raise ValueError(f"a CRD schema node needs a type: {node}")
    return node
