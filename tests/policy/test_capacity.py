"""Capacity is membership, not failure (docs/design.md §3.17): when a job waits for capacity, and how many of
the workers it lacks fit this machine."""

from __future__ import annotations

import pytest

from elastic.cluster import WorkerObservation
from elastic.cluster.pod_status import waiting_reason
from elastic.policy.capacity import LocalFit, capacity_due, capacity_timed_out, capacity_wait, local_fit

READY = WorkerObservation("w1", True)
UNSCHEDULABLE = WorkerObservation("w2", True, ready=False, pending=True, waiting="Unschedulable: 0/3 nodes")
STARTING = WorkerObservation("w3", True, ready=False, pending=True)


@pytest.mark.parametrize(
    ("workers", "trained", "shortfall", "reason"),
    [
        pytest.param((READY, UNSCHEDULABLE), False, None, None, id="a job that never trained is not waiting"),
        pytest.param((READY, UNSCHEDULABLE), True, None, "Unschedulable", id="below min, a pod unschedulable"),
        pytest.param((READY, STARTING), True, None, None,
                     id="a replacement still starting is a recovery, not a wait for capacity"),
        pytest.param((READY,), True, "no room", "LocalCapacity", id="the machine's cap is taken: LocalCapacity"),
        pytest.param((READY, WorkerObservation("w2", True)), True, None, None, id="at min: no wait"),
    ],
)  # fmt: skip
def test_capacity_wait(workers, trained: bool, shortfall: str | None, reason: str | None) -> None:
    wait = capacity_wait(workers, 2, trained, shortfall)
    assert (wait.reason if wait else None) == reason


@pytest.mark.parametrize(
    ("since", "now", "timeout", "expected"),
    [(None, 1e9, 60, False), (100.0, 159.0, 60, False), (100.0, 160.0, 60, True), (100.0, 1e9, 0, False)],
    ids=["not waiting", "within the timeout", "at the timeout", "0 waits forever"],
)
def test_capacity_timed_out(since: float | None, now: float, timeout: int, expected: bool) -> None:
    assert capacity_timed_out(since, now, timeout) is expected


@pytest.mark.parametrize(
    ("since", "now", "timeout", "due"),
    [(100.0, 130.0, 60, 30.0), (None, 130.0, 60, 60.0), (100.0, 1e9, 60, 0.0), (100.0, 130.0, 0, None)],
    ids=["the rest of the timeout", "a wait beginning now", "past: due now", "0 waits forever: never"],
)
def test_capacity_due(since: float | None, now: float, timeout: int, due: float | None) -> None:
    assert capacity_due(since, now, timeout) == due


@pytest.mark.parametrize(
    ("missing", "running", "low", "nproc", "cap", "elsewhere", "start", "limited"),
    [
        pytest.param(8, 0, 1, 2, 8, 0, 4, True, id="min 1, 8 wanted at 2 per node, cap 8: 4 start"),
        pytest.param(2, 0, 2, 1, 8, 7, 0, True, id="1 slot left and min 2: none start, the job waits"),
        pytest.param(3, 0, 2, 1, 8, 5, 3, False, id="room for all"),
        pytest.param(2, 2, 2, 1, 8, 6, 0, True, id="running at min, no room to grow: none start"),
        pytest.param(2, 2, 2, 1, 8, 0, 2, False, id="room again: it grows back"),
        pytest.param(5, 0, 1, 1, None, 0, 5, False, id="no cap (pods): all start"),
        pytest.param(0, 2, 1, 1, 1, 0, 0, False, id="nothing missing"),
    ],
)  # fmt: skip
def test_local_fit(missing, running, low, nproc, cap, elsewhere, start: int, limited: bool) -> None:
    fit = local_fit(missing, running, low, nproc, cap, elsewhere)
    assert (fit.start, fit.limited is not None) == (start, limited)
    assert isinstance(fit, LocalFit)


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param({"spec": {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]},
                      "status": {"phase": "Pending", "conditions": [
                          {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}},
                     "SchedulingGated: kueue.x-k8s.io/admission", id="a Kueue gate"),
        pytest.param({"status": {"phase": "Pending", "conditions": [
                          {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}},
                     "SchedulingGated", id="gated, the gate's name not listed"),
    ],
)  # fmt: skip
def test_scheduling_gated_pods_are_waiting(pod, expected: str) -> None:
    assert waiting_reason(pod) == expected
