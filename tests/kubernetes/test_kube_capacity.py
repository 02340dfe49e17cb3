"""Capacity is membership, not failure (docs/design.md §3.17), on the fake cluster (no API server runs here:
the fake follows the real one's rules) with a real JobController and a real etcd.

The probe of issue 21: min 2 / max 4, two pods running, two Unschedulable for 900 s (past the 600 s
startupTimeoutSeconds), then one running pod evicted. That used to fail the job `StartupTimeout` in the same
pass; a job that trained waits for capacity instead, free, and runs again when a node returns.
"""

from __future__ import annotations

import time

from kube_harness import Harness

from harness.agents import wait_until


def train_at_two_of_four(h: Harness) -> tuple[list[str], list[str]]:
    """Four pods: two run and seal round 0, two cannot be scheduled (created 900 s ago)."""
    h.step()
    h.step()
    names = h.pods()
    assert len(names) == 4
    running, waiting = names[:2], names[2:]
    for name in running:
        h.fake.run_pod(name)
    for name in waiting:
        h.fake.unschedulable(name)
        h.fake.created_ago(name, 900)
    state = h.controller.run.read()
    assert h.controller.run.seal(state, state.round, {f"{n}-{100 + i}-ab{i}": i for i, n in enumerate(running)})
    assert h.step()["phase"] == "Running"
    return running, waiting


def step_until(h: Harness, done, timeout: float = 10.0) -> dict:
    """Step the controller until its status satisfies `done`; that status."""
    seen: list[dict] = []
    assert wait_until(lambda: done(seen.append(h.step()) or seen[-1]), timeout, interval=0.05), seen[-1:]
    return seen[-1]


def test_a_capacity_dip_below_min_waits_free_and_recovers_when_a_node_returns(harness) -> None:
    h = harness(minReplicas=2, maxReplicas=4, replicas=4)
    running, waiting = train_at_two_of_four(h)
    h.fake.set_pod(running[1], "Failed", 137, reason="Evicted")  # a drain or a reclaim takes one running pod
    status = step_until(h, lambda s: s["reason"] == "WaitingForCapacity")
    assert h.controller.run.read().closed is None, "below min after training is never StartupTimeout"
    assert status["phase"] != "Failed" and "1 of minReplicas 2" in status["message"], status
    (condition,) = [c for c in status["conditions"] if c["type"] == "WaitingForCapacity"]
    assert (condition["status"], condition["reason"]) == ("True", "Unschedulable"), condition
    assert h.budget()["used"] == 0, "an eviction is voluntary: never charged"
    assert h.kube_job()["status"]["reason"] == "WaitingForCapacity"
    # a node returns: the waiting pods are scheduled and run
    for name in waiting:
        h.fake.run_pod(name)
    status = step_until(h, lambda s: s["reason"] != "WaitingForCapacity")
    (condition,) = [c for c in status["conditions"] if c["type"] == "WaitingForCapacity"]
    assert condition["status"] == "False" and h.controller.run.read().closed is None
    assert h.budget()["used"] == 0


def test_a_wait_for_capacity_ends_after_its_own_timeout(harness) -> None:
    h = harness(minReplicas=2, maxReplicas=4, replicas=4, capacityTimeoutSeconds=1)
    running, _ = train_at_two_of_four(h)
    h.fake.set_pod(running[1], "Failed", 137, reason="Evicted")
    began = time.monotonic()
    status = step_until(h, lambda s: s["phase"] == "Failed", timeout=15)
    assert time.monotonic() - began >= 1.0, "not before the timeout"
    assert status["reason"] == "CapacityTimeout" and "spec.capacityTimeoutSeconds (1 s)" in status["message"]
    assert h.budget()["used"] == 0


def test_scheduling_gated_pods_are_waiting_not_failed(harness) -> None:
    h = harness(minReplicas=2, maxReplicas=4, replicas=4)
    running, waiting = train_at_two_of_four(h)
    for name in waiting:
        h.fake.set_pod(name, "Pending", conditions=[{"type": "PodScheduled", "status": "False",
                                                     "reason": "SchedulingGated"}])
    h.fake.set_pod(running[1], "Failed", 137, reason="Evicted")
    status = step_until(h, lambda s: s["reason"] == "WaitingForCapacity")
    (condition,) = [c for c in status["conditions"] if c["type"] == "WaitingForCapacity"]
    assert condition["reason"] == "SchedulingGated", condition
    assert h.controller.run.read().closed is None
