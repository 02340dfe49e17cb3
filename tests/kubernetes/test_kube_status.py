"""Which Kubernetes Events a status change produces (pure, no API server), and the writer's idempotence.

The writer's requests go to the FAKE API server of fake_api.py (no kube-apiserver can run here).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from fake_api import FakeApiServer
from kubernetes import client

from elastic.controller.kube_status import JobEvent, KubeStatus, events_for
from elastic.spec import parse_job


def status(phase: str, reason: str, rnd: int = 0, used: int = 0, **extra: Any) -> dict[str, Any]:
    return {"phase": phase, "reason": reason, "message": f"{reason} text", "round": rnd,
            "restarts": {"used": used, "max": 3}, **extra}  # fmt: skip


FAILURE = {"cause": "exit code 137 (SIGKILL) of worker j-1", "round": 2}


@pytest.mark.parametrize(
    ("previous", "new", "expected"),
    [
        (None, status("Created", "Gathering"), [JobEvent("Normal", "Gathering", "Created: Gathering text")]),
        (status("Created", "Gathering"), status("Created", "Gathering"), []),
        (
            status("Created", "Gathering"),
            status("Running", "RoundSealed", 0),
            [JobEvent("Normal", "RoundSealed", "Running: RoundSealed text")],
        ),
        # a charge: the Restarted event first, then the state change it caused
        (
            status("Running", "RoundSealed", 2),
            status("Restarting", "WorkerExited", 3, 1, lastFailure=FAILURE),
            [
                JobEvent(
                    "Warning", "Restarted", "restart 1/3 charged: exit code 137 (SIGKILL) of worker j-1 in round 2"
                ),
                JobEvent("Warning", "WorkerExited", "Restarting: WorkerExited text"),
            ],
        ),
        # the Restarting phase missed between two observations: still one event per charge, and the new round
        (
            status("Running", "RoundSealed", 2),
            status("Running", "RoundSealed", 4, 2, lastFailure=FAILURE),
            [
                JobEvent("Warning", "Restarted", "restart 1/3 charged"),
                JobEvent(
                    "Warning", "Restarted", "restart 2/3 charged: exit code 137 (SIGKILL) of worker j-1 in round 2"
                ),
                JobEvent("Normal", "RoundSealed", "Running: RoundSealed text"),
            ],
        ),
        # only counters changed (progress, replicas): no event
        (status("Running", "RoundSealed", 2), status("Running", "RoundSealed", 2, progress={"step": 5}), []),
        (
            status("Running", "RoundSealed", 2),
            status("Failed", "BackoffLimitExceeded", 2),
            [JobEvent("Warning", "BackoffLimitExceeded", "Failed: BackoffLimitExceeded text")],
        ),
        (
            status("Running", "RoundSealed", 2),
            status("Succeeded", "Succeeded", 2),
            [JobEvent("Normal", "Succeeded", "Succeeded: Succeeded text")],
        ),
    ],
)
def test_events_for(previous: dict | None, new: dict, expected: list[JobEvent]) -> None:
    assert events_for(previous, new) == expected


def test_publish_writes_only_changes(fake: FakeApiServer, api_client: client.ApiClient) -> None:
    doc = {"apiVersion": "elastic.dev/v1alpha1", "kind": "ElasticJob", "metadata": {"name": "sj"},
           "spec": {"maxReplicas": 2, "worker": {"command": ["python", "t.py"], "image": "i"}}}  # fmt: skip
    fake.add_job(doc)
    writer = KubeStatus(client.CustomObjectsApi(api_client), client.CoreV1Api(api_client), parse_job(doc))
    assert writer.publish(status("Running", "RoundSealed", 1)) is True
    assert writer.publish(status("Running", "RoundSealed", 1)) is False
    assert len(fake.events) == 1 and fake.requests.count(("elastic.dev", "elasticjobs/status", "patch")) == 1
    # a job deleted meanwhile: no error, the controller winds down on its own
    del fake.jobs[("default", "sj")]
    assert writer.publish(status("Failed", "Deleted", 1)) is True


def test_every_status_field_the_controller_writes_survives_the_crds_pruning(harness) -> None:
    """The API server prunes what the structural schema does not declare: what the controller wrote must
    read back whole (a running job with progress and a charge, then one with a corrupt key)."""
    h = harness()
    names = h.start_training()
    h.store.put_json(h.keys.progress, {"step": 5, "loss": 0.5, "world_size": 2, "total": 100, "at": 1.0})
    h.fake.set_pod(names[0], "Failed", exit_code=1)
    deadline = time.monotonic() + 10
    while "lastFailure" not in (written := h.step()):
        assert time.monotonic() < deadline, written
    assert written["progress"]["total"] == 100
    selector = {"selector": f"elastic.dev/job={h.name}"}
    assert h.kube_job()["status"] == {**written, **selector}
    h.store.put(h.keys.budget, b"not json")  # a key that does not decode: CorruptState and status.corrupt
    written = h.step()
    assert "corrupt" in written and h.kube_job()["status"] == {**written, **selector}
