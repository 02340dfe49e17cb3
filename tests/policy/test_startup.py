"""startupTimeoutSeconds: a job that cannot train because its workers cannot start fails; one that can, waits."""

from __future__ import annotations

import pytest

from elastic.cluster import WorkerObservation
from elastic.policy.startup import startup_due, startup_timed_out


def ready(name: str, started: float = 10.0) -> WorkerObservation:
    return WorkerObservation(name, True, started_at=started)


def pending(name: str, started: float = 10.0, waiting: str | None = None) -> WorkerObservation:
    return WorkerObservation(name, True, started_at=started, ready=False, waiting=waiting, pending=True)


PULL = "ImagePullBackOff: Back-off pulling image"
NO_NODE = "Unschedulable: 0/3 nodes are available"
LOST = WorkerObservation("lost", True, started_at=10.0, ready=False)  # ran, then its node went NotReady

CASES = [
    # workers, now, timeout, minReplicas, expected (None, or words the message must hold)
    pytest.param([pending("a", waiting=PULL)], 609.0, 600, 1, None, id="a second before the timeout it waits"),
    pytest.param([pending("a", waiting=PULL)], 610.0, 600, 1, ["worker a", "600 s", PULL, "0 of minReplicas 1"],
                 id="exactly at the timeout the job fails, naming the worker and its image pull"),
    pytest.param([pending("a")], 1000.0, 600, 1, ["worker a", "(Pending)"],
                 id="pending with no reason said (creating, init containers) counts too"),
    pytest.param([ready("a"), pending("b", waiting=NO_NODE)], 1e6, 600, 1, None,
                 id="minReplicas ready: a worker waiting for room is capacity to come, not a failure"),
    pytest.param([ready("a"), pending("b", waiting=NO_NODE)], 1e6, 600, 2, ["worker b", NO_NODE, "1 of minReplicas 2"],
                 id="fewer than minReplicas ready: the job cannot train and fails"),
    pytest.param([pending("new", started=500.0), pending("old", started=5.0, waiting=PULL)], 1000.0, 600, 2,
                 ["worker old", "995 s"], id="the longest-waiting worker is named"),
    pytest.param([pending("a", started=5.0), pending("b", started=6.0)], 1000.0, 600, 2, ["worker a", "(and 1 more)"],
                 id="more late workers are counted"),
    pytest.param([LOST], 1e6, 600, 1, None, id="a worker that ran and lost readiness is a loss, not a slow start"),
    pytest.param([pending("a", started=0.0)], 1e6, 600, 1, None, id="a creation time never seen is never late"),
    pytest.param([WorkerObservation("a", True, started_at=10.0, ready=False, pending=True, stopping=True)], 1e6,
                 600, 1, None, id="a worker being stopped is not waited for"),
    pytest.param([WorkerObservation("a", False, 1, started_at=10.0)], 1e6, 600, 1, None,
                 id="an ended worker is the exit policy's, not this one's"),
    pytest.param([ready("a")], 1e6, 1, 1, None, id="a local process is ready at once"),
]  # fmt: skip


@pytest.mark.parametrize(("workers", "now", "timeout", "min_replicas", "expected"), CASES)
def test_startup_timeout(workers, now: float, timeout: int, min_replicas: int, expected: list[str] | None) -> None:
    message = startup_timed_out(workers, now, timeout, min_replicas)
    if expected is None:
        assert message is None
    else:
        assert message is not None and all(words in message for words in expected), message


@pytest.mark.parametrize(("workers", "now", "min_replicas", "due"), [
    pytest.param([pending("a", started=10.0)], 300.0, 1, 310.0, id="600 s from the pod's creation"),
    pytest.param([pending("a", started=500.0), pending("b", started=10.0)], 300.0, 2, 310.0, id="the oldest first"),
    pytest.param([pending("a", started=10.0)], 1e6, 1, 0.0, id="already late: due now"),
    pytest.param([ready("a"), pending("b")], 300.0, 1, None, id="minReplicas ready: never"),
    pytest.param([pending("a", started=0.0)], 300.0, 1, None, id="a creation time never seen: never"),
    pytest.param([ready("a")], 300.0, 2, None, id="nothing starting: only a new worker can make it due"),
])  # fmt: skip
def test_startup_due(workers, now: float, min_replicas: int, due: float | None) -> None:
    assert startup_due(workers, now, 600, min_replicas) == due
    if due:  # the same rule as startup_timed_out: not a second before, at once at it
        assert startup_timed_out(workers, now + due - 1.0, 600, min_replicas) is None
        assert startup_timed_out(workers, now + due, 600, min_replicas) is not None
