"""A valid spec that will run otherwise than it says gets a warning naming the field (and stays valid)."""

from __future__ import annotations

import pytest

from elastic.policy.spec_warnings import spec_warnings
from elastic.spec import parse_job


def job(**spec: object):
    return parse_job({
        "apiVersion": "elastic.dev/v1alpha1", "kind": "ElasticJob", "metadata": {"name": "w"},
        "spec": {"worker": {"command": ["python", "train.py"]}, **spec},
    })  # fmt: skip


CASES = [
    pytest.param({"minReplicas": 2, "maxReplicas": 4}, [], id="replicas unset runs maxReplicas: nothing to say"),
    pytest.param({"minReplicas": 2, "maxReplicas": 4, "replicas": 3}, [], id="replicas inside the bounds is quiet"),
    pytest.param({"minReplicas": 2, "maxReplicas": 4, "replicas": 2}, [], id="replicas at minReplicas is quiet"),
    pytest.param(
        {"minReplicas": 1, "maxReplicas": 2, "replicas": 0},
        ["spec.replicas: 0 is below minReplicas; the job runs 1 worker(s) (clamped into [1, 2])"],
        id="replicas 0 warns that minReplicas run",
    ),
    pytest.param(
        {"minReplicas": 3, "maxReplicas": 5, "replicas": 1},
        ["spec.replicas: 1 is below minReplicas; the job runs 3 worker(s) (clamped into [3, 5])"],
        id="replicas below minReplicas warns",
    ),
    pytest.param(
        {"maxReplicas": 4, "replicas": 2147483647},
        ["spec.replicas: 2147483647 is above maxReplicas; the job runs 4 worker(s) (clamped into [1, 4])"],
        id="replicas above maxReplicas warns with the clamped value",
    ),
]


@pytest.mark.parametrize(("spec", "expected"), CASES)
def test_spec_warnings(spec: dict[str, object], expected: list[str]) -> None:
    assert spec_warnings(job(**spec)) == expected


TEMPLATE = {"command": ["python", "train.py"], "template": {"spec": {"tolerations": [{"operator": "Exists"}]}}}


@pytest.mark.parametrize(("local", "expected"), [(True, 1), (False, 0)], ids=["a local run warns", "validate does not"])
def test_a_pod_template_is_said_to_be_ignored_by_a_local_run(local: bool, expected: int) -> None:
    lines = spec_warnings(job(maxReplicas=1, worker=TEMPLATE), local=local)
    assert len(lines) == expected and all(line.startswith("spec.worker.template: ") for line in lines)
    assert spec_warnings(job(maxReplicas=1), local=True) == []
