"""The CRD schema is structural (Kubernetes accepts it) and rejects what the model rejects."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from elastic.spec import (
    ExitCodeOperator,
    RestartPolicy,
    RuleAction,
    SpecError,
    SuccessPolicy,
    openapi_v3_schema,
    parse_job,
)

VALID: dict[str, Any] = {
    "apiVersion": "elastic.dev/v1alpha1",
    "kind": "ElasticJob",
    "metadata": {"name": "train", "namespace": "ml", "labels": {"app.kubernetes.io/name": "train"}},
    "spec": {
        "minReplicas": 1,
        "maxReplicas": 4,
        "replicas": 2,
        "worker": {
            "command": ["python", "examples/train_ddp.py"],
            "env": [{"name": "A", "value": "1"}],
            "resources": {"limits": {"cpu": "1", "nvidia.com/gpu": 1}},
        },
        "rendezvous": {"lastCallSeconds": 1, "endpoints": ["etcd:2379"]},
        "failurePolicy": {
            "maxRestarts": 2,
            "rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [1]}}],
        },
        "restartPolicy": "ExitCode",
        "successPolicy": "Rank0",
        "activeDeadlineSeconds": 600,
    },
    "status": {"phase": "Running", "conditions": [{"type": "Running", "status": "True"}]},
}


def _nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path or "(root)", schema
    for name, child in schema.get("properties", {}).items():
        yield from _nodes(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}{{}}")


def _validator() -> jsonschema.Draft7Validator:
    schema = openapi_v3_schema()
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def test_schema_is_structural() -> None:
    schema = openapi_v3_schema()
    forbidden = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "const", "title"}
    for path, node in _nodes(schema):
        assert not forbidden & node.keys(), path
        if not node.get("x-kubernetes-preserve-unknown-fields"):
            assert node.get("type") in {"object", "array", "string", "integer", "number", "boolean"}, path
        assert not ("properties" in node and "additionalProperties" in node), path
        assert node.get("default", "") is not None, path


def test_metadata_restricts_only_the_name() -> None:
    metadata = openapi_v3_schema()["properties"]["metadata"]
    assert metadata == {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 58, "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}},
    }


def test_status_is_loose_and_free_form_fields_are_preserved() -> None:
    props = openapi_v3_schema()["properties"]
    assert props["status"] == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    resources = props["spec"]["properties"]["worker"]["properties"]["resources"]
    assert resources["x-kubernetes-preserve-unknown-fields"] is True and resources["nullable"] is True


def test_enums_minimums_and_nullables_come_from_the_model() -> None:
    spec = openapi_v3_schema()["properties"]["spec"]
    props = spec["properties"]
    rule = props["failurePolicy"]["properties"]["rules"]["items"]
    assert props["restartPolicy"]["enum"] == [p.value for p in RestartPolicy]
    assert props["successPolicy"]["enum"] == [p.value for p in SuccessPolicy]
    assert rule["properties"]["action"]["enum"] == [a.value for a in RuleAction]
    assert rule["properties"]["onExitCodes"]["properties"]["operator"]["enum"] == [o.value for o in ExitCodeOperator]
    assert rule["properties"]["onExitCodes"]["nullable"] is True
    assert (props["minReplicas"]["minimum"], props["maxReplicas"]["minimum"]) == (1, 1)
    assert props["failurePolicy"]["properties"]["maxRestarts"]["minimum"] == 0
    assert props["replicas"] == {  # never null: GET /scale would fail on it
        "type": "integer",
        "minimum": 0,
        "maximum": 2147483647,
        "description": "Desired nodes; unset means maxReplicas; clamped into [min, max].",
    }
    assert spec["required"] == ["maxReplicas", "worker"]
    assert [v["rule"] for v in spec["x-kubernetes-validations"]] == [
        "!has(self.minReplicas) || self.minReplicas <= self.maxReplicas"
    ]


def test_a_valid_example_validates() -> None:
    _validator().validate(VALID)
    parse_job(VALID)  # and the model agrees


def test_a_parsed_job_with_defaults_filled_in_validates() -> None:
    _validator().validate(parse_job(VALID).to_dict())


def _with(path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(VALID)
    parent: Any = doc
    for step in path[:-1]:
        parent = parent[step]
    if value is None:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


INVALID = [
    pytest.param(("kind",), "PyTorchJob", ["kind"], id="a foreign kind fails"),
    pytest.param(("spec", "worker"), None, ["spec"], id="a spec without a worker fails"),
    pytest.param(("spec", "minReplicas"), 0, ["spec", "minReplicas"], id="minReplicas 0 fails"),
    pytest.param(("spec", "maxReplicas"), "4", ["spec", "maxReplicas"], id="a quoted maxReplicas fails"),
    pytest.param(("spec", "restartPolicy"), "Always", ["spec", "restartPolicy"], id="an unknown restartPolicy fails"),
    pytest.param(("spec", "worker", "command"), [], ["spec", "worker", "command"], id="an empty command fails"),
    pytest.param(
        ("spec", "worker", "env", 0, "value"), 1, ["spec", "worker", "env", 0, "value"], id="a numeric env value fails"
    ),
    pytest.param(
        ("spec", "failurePolicy", "rules", 0, "action"),
        "Retry",
        ["spec", "failurePolicy", "rules", 0, "action"],
        id="an unknown rule action fails",
    ),
    pytest.param(
        ("spec", "failurePolicy", "rules", 0, "onExitCodes", "values", 0),
        300,
        ["spec", "failurePolicy", "rules", 0, "onExitCodes", "values", 0],
        id="an exit code above 255 fails",
    ),
    pytest.param(("metadata", "name"), "Not_A_Label", ["metadata", "name"], id="a name that is not a DNS label fails"),
]


@pytest.mark.parametrize(("path", "value", "where"), INVALID)
def test_invalid_examples_fail_jsonschema_and_the_model(
    path: tuple[str | int, ...], value: Any, where: list[str | int]
) -> None:
    document = _with(path, value)
    errors = list(_validator().iter_errors(document))
    assert [list(error.absolute_path) for error in errors] == [where]
    with pytest.raises(SpecError):
        parse_job(document)


def test_unknown_fields_fail_only_in_strict_mode() -> None:
    document = _with(("spec", "worker", "comand"), ["python"])
    assert list(_validator().iter_errors(document)) == []  # the API server prunes them instead
    strict = jsonschema.Draft7Validator(openapi_v3_schema(reject_unknown_fields=True))
    errors = list(strict.iter_errors(document))
    assert [(list(e.absolute_path), e.validator) for e in errors] == [(["spec", "worker"], "additionalProperties")]
