"""The ElasticJob CustomResourceDefinition, built from the model so that the API server and `parse_job` agree.

`manifests/crd.yaml` is this module's output, committed; a test fails when the two differ. Regenerate it with

    python -m elastic.spec.crd > manifests/crd.yaml

The spec schema comes from `openapi_v3_schema()` unchanged. The status schema is written out here: the
controller writes it, `kubectl get ej` prints it and the scale subresource reads it, so each of those
fields is declared with its type (the API server rejects a status write with a wrong type instead of
storing it); fields the controller may add later are kept too (`x-kubernetes-preserve-unknown-fields`).
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from elastic.spec.model import API_VERSION, KIND
from elastic.spec.schema import openapi_v3_schema

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "elasticjobs"
SINGULAR = "elasticjob"
SHORT_NAMES = ["ej"]
CRD_NAME = f"{PLURAL}.{GROUP}"

_PRESERVE = "x-kubernetes-preserve-unknown-fields"
_TIME = {"type": "string", "format": "date-time"}

# What the controller writes under `.status`; the printer columns and the scale subresource read from it.
STATUS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Written by the controller through the status subresource; the same fields as the status "
    "key in etcd. Every field is declared: the API server prunes what a structural schema does not name.",
    "properties": {
        "observedGeneration": {"type": "integer", "description": "metadata.generation this status reflects."},
        "phase": {"type": "string", "description": "Pending, Running, Restarting, Succeeded or Failed."},
        "reason": {"type": "string", "description": "Why the job is in its phase, e.g. BackoffLimitExceeded."},
        "message": {"type": "string"},
        "conditions": {
            "type": "array",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
            "items": {
                "type": "object",
                "required": ["type", "status"],
                "properties": {
                    "type": {"type": "string"},
                    "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                    "reason": {"type": "string"},
                    "message": {"type": "string"},
                    "lastTransitionTime": _TIME,
                },
            },
        },
        "round": {"type": "integer", "description": "Number of the current (or last) sealed round."},
        "worldSize": {"type": "integer", "description": "Members of the current round."},
        "replicas": {
            "type": "object",
            "properties": {
                "desired": {"type": "integer", "description": "spec.replicas clamped into [min, max]."},
                "active": {"type": "integer", "description": "Workers running now (the scale subresource)."},
            },
        },
        "replicasText": {"type": "string", "description": 'active/desired for kubectl, e.g. "2/3".'},
        "spares": {
            "type": "object",
            "description": "Hot spares (spec.spares): wanted, and ready (waiting warm outside the round).",
            "properties": {"wanted": {"type": "integer"}, "ready": {"type": "integer"}},
        },
        "restarts": {
            "type": "object",
            "properties": {
                "used": {"type": "integer", "description": "Charges against the budget so far."},
                "max": {"type": "integer", "description": "failurePolicy.maxRestarts."},
            },
        },
        "restartsText": {"type": "string", "description": 'used/max for kubectl, e.g. "1/3".'},
        "lastFailure": {
            "type": "object",
            "description": "The last charge against the budget.",
            "properties": {
                "worker": {"type": "string", "nullable": True},
                "exitCode": {"type": "integer", "nullable": True},
                "reason": {"type": "string"},
                "cause": {"type": "string", "description": "The first cause, in words (exit code, signal, reason)."},
                "round": {"type": "integer"},
            },
        },
        "progress": {
            "type": "object",
            "description": "What rank 0 last reported.",
            "properties": {
                "step": {"type": "integer"},
                "loss": {"type": "number"},
                "world_size": {"type": "integer"},
                "total": {"type": "integer", "description": "The steps the job will run, if rank 0 says."},
            },
        },
        "corrupt": {
            "type": "object",
            "description": "A key of the job that does not decode (with the CorruptState condition).",
            "properties": {"key": {"type": "string"}, "problem": {"type": "string"}},
        },
        "selector": {
            "type": "string",
            "description": "Label selector of the job's worker pods (the scale subresource, for an HPA).",
        },
        "startTime": _TIME,
        "completionTime": _TIME,
    },
}

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Replicas", "type": "string", "jsonPath": ".status.replicasText", "description": "active/desired"},
    {"name": "Min", "type": "integer", "jsonPath": ".spec.minReplicas"},
    {"name": "Max", "type": "integer", "jsonPath": ".spec.maxReplicas"},
    {"name": "Round", "type": "integer", "jsonPath": ".status.round"},
    {"name": "Restarts", "type": "string", "jsonPath": ".status.restartsText", "description": "used/max"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

SCALE = {
    "specReplicasPath": ".spec.replicas",
    "statusReplicasPath": ".status.replicas.active",
    "labelSelectorPath": ".status.selector",
}


def job_schema() -> dict[str, Any]:
    """The version's `openAPIV3Schema`: the model's spec schema and the controller's status schema."""
    schema = openapi_v3_schema()
    schema.setdefault("type", "object")
    schema["properties"]["status"] = STATUS_SCHEMA
    return schema


def build_crd() -> dict[str, Any]:
    """The `apiextensions.k8s.io/v1` CustomResourceDefinition of ElasticJob."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/name": "elastic", "app.kubernetes.io/part-of": "elastic"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": job_schema()},
                    "subresources": {"status": {}, "scale": dict(SCALE)},
                    "additionalPrinterColumns": [dict(column) for column in PRINTER_COLUMNS],
                }
            ],
        },
    }


HEADER = "# Generated by `python -m elastic.spec.crd > manifests/crd.yaml` from elastic/spec; do not edit.\n"


class _NoAliasDumper(yaml.SafeDumper):
    """Writes a repeated sub-schema out each time: `&id001` anchors would only puzzle a reader."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render_crd() -> str:
    """`build_crd()` as the YAML text of `manifests/crd.yaml`."""
    return HEADER + yaml.dump(build_crd(), Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=False, width=120)


def main() -> int:
    sys.stdout.write(render_crd())
    return 0


if __name__ == "__main__":
    sys.exit(main())
