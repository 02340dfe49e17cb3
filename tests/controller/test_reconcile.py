"""The controller's decisions as tables: observed state in, actions out. No etcd, no processes."""

from __future__ import annotations

import pytest

from elastic.cluster import WorkerObservation
from elastic.controller.reconcile import (
    CloseJob,
    ForgetWorker,
    HandleExit,
    InitRun,
    Observed,
    StartWorkers,
    StopWorker,
    reconcile,
    seconds_until_due,
)
from elastic.controller.status import condition_since, job_status
from elastic.policy.budget import Budget, Charge
from elastic.policy.exits import Action
from elastic.rendezvous.state import Closed, Departure, JobState, Member, Round
from elastic.spec import parse_job


def job(**spec):
    base = {"minReplicas": 2, "maxReplicas": 3, "replicas": 2, "worker": {"command": ["python", "t.py"]},
            "failurePolicy": {"maxRestarts": 3, "rules": [
                {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}]}}
    return parse_job({"apiVersion": "elastic.dev/v1alpha1", "kind": "ElasticJob",
                      "metadata": {"name": "j"}, "spec": {**base, **spec}})


def alive(name, started=0.0):
    return WorkerObservation(name, True, started_at=started)


def exited(name, code, stopping=False):
    return WorkerObservation(name, False, code, stopping=stopping)


SEALED = Round(4, sealed=True, members={"w1-11-aa": 0, "w2-22-bb": 1})
RUNNING = JobState(run_id="r", round=SEALED, budget=Budget(3),
                   members={"w1-11-aa": Member("w1-11-aa", 4), "w2-22-bb": Member("w2-22-bb", 4)})


TWO_ALIVE = (WorkerObservation("w1", True), WorkerObservation("w2", True))


def observed(state=RUNNING, workers=TWO_ALIVE, spec=None, started_at=None, now=1000.0):
    return Observed(spec or job(), state, tuple(workers), started_at=started_at, now=now)


def test_a_job_without_a_run_initialises_it_first() -> None:
    assert reconcile(observed(state=JobState())) == [InitRun()]


def test_missing_workers_are_started_up_to_desired() -> None:
    assert reconcile(observed(workers=(alive("w1"),))) == [StartWorkers(1)]


def test_a_healthy_job_needs_nothing() -> None:
    assert reconcile(observed()) == []


def test_a_worker_killed_by_sigkill_ends_its_round_with_a_charge_and_is_replaced() -> None:
    actions = reconcile(observed(workers=(alive("w1"), exited("w2", -9))))
    handle = actions[0]
    assert isinstance(handle, HandleExit) and handle.round == 4
    assert handle.incident.action is Action.RESTART_JOB and handle.incident.failure.code == 137
    assert actions[1:] == [ForgetWorker("w2"), StartWorkers(1)]


def test_an_exit_code_with_a_fail_job_rule_is_permanent() -> None:
    handle = reconcile(observed(workers=(alive("w1"), exited("w2", 3))))[0]
    assert handle.incident.action is Action.FAIL_JOB
    assert "rules[0]" in handle.incident.why


def test_a_worker_outside_the_current_round_charges_nothing() -> None:
    handle = reconcile(observed(workers=(alive("w1"), alive("w2"), exited("w9", 1))))[0]
    assert handle.round is None


def test_a_worker_that_finished_is_counted_and_not_replaced() -> None:
    assert reconcile(observed(workers=(alive("w1"), exited("w2", 0)))) == []


def test_an_adopted_worker_gone_after_finishing_is_not_a_failure() -> None:
    finished = JobState(**{**RUNNING.__dict__, "departed": {"w2-22-bb": Departure("Finished", 4)}})
    assert reconcile(observed(state=finished, workers=(alive("w1"), exited("w2", None)))) == []


def test_scale_down_stops_the_newest_worker_and_announces_it() -> None:
    actions = reconcile(observed(workers=(alive("w1", 1.0), alive("w2", 2.0), alive("w3", 3.0))))
    assert actions == [StopWorker("w3", "ScaleDown", None, 4)]


def test_replicas_above_max_are_clamped() -> None:
    assert reconcile(observed(spec=job(replicas=9), workers=(alive("w1"),))) == [StartWorkers(2)]


def test_a_closed_job_stops_every_running_worker() -> None:
    closed = JobState(**{**RUNNING.__dict__, "closed": Closed("BackoffLimitExceeded", "spent")})
    assert reconcile(observed(state=closed)) == [StopWorker("w1"), StopWorker("w2")]


def test_the_active_deadline_closes_the_job() -> None:
    actions = reconcile(observed(spec=job(activeDeadlineSeconds=60), started_at=900.0, now=961.0))
    assert actions == [CloseJob("DeadlineExceeded", "activeDeadlineSeconds (60 s) passed")]


def test_rank0_success_policy_closes_as_soon_as_the_chief_is_done() -> None:
    done = JobState(**{**RUNNING.__dict__, "done": {"w1-11-aa": 4}})
    actions = reconcile(observed(state=done, spec=job(successPolicy="Rank0")))
    assert actions == [CloseJob("Succeeded", "rank 0 (w1-11-aa) finished with exit 0 (successPolicy Rank0)")]
    assert reconcile(observed(state=done)) == [], "AllWorkers waits for everyone"


def test_status_reads_like_kubeflow() -> None:
    charged = JobState(**{**RUNNING.__dict__, "budget": Budget(3, 1, (Charge(3, "WorkerFailure", "exit code 137",
                                                                               137, "w2-22-bb"),))})
    status = job_status(observed(state=charged), None, {"step": 40, "loss": 0.25, "world_size": 2})
    assert status["phase"] == "Running" and status["round"] == 4 and status["worldSize"] == 2
    assert status["replicas"] == {"desired": 2, "active": 2} and status["restarts"] == {"used": 1, "max": 3}
    assert status["lastFailure"]["exitCode"] == 137 and status["progress"]["step"] == 40
    assert [c["type"] for c in status["conditions"]] == ["Created", "Running"]
    assert {c["type"]: c["status"] for c in status["conditions"]} == {"Created": "False", "Running": "True"}


@pytest.mark.parametrize(("closed", "phase"), [(Closed("Succeeded", "ok"), "Succeeded"),
                                                (Closed("BackoffLimitExceeded", "spent"), "Failed"),
                                                (Closed("FailJobRule", "exit 3"), "Failed")])
def test_final_phase_follows_the_closed_reason(closed, phase) -> None:
    state = JobState(**{**RUNNING.__dict__, "closed": closed})
    status = job_status(observed(state=state), None, None)
    assert (status["phase"], status["reason"]) == (phase, closed.reason) and "completionTime" in status


CAPACITY = [
    pytest.param({}, None, (), "start", 2, id="no cap (pods elsewhere): start what is missing"),
    pytest.param({}, 2, (), "start", 2, id="two workers of one process fit a cap of 2"),
    pytest.param({}, 1, (), "close", 0, id="minReplicas 2 can never fit a cap of 1: fail before starting one"),
    pytest.param({"nprocPerNode": 4}, 7, (), "close", 0, id="nprocPerNode counts: min 2 x 4 is over 7"),
    pytest.param({"replicas": 3}, 2, (alive("w1"), alive("w2")), "none", 0,
                 id="scaling a running job past the cap runs it at what fits (issue 21: it used to fail)"),
    pytest.param({"replicas": 2}, 2, (alive("w1"), alive("w2")), "none", 0, id="a job at its size asks nothing"),
    pytest.param({"maxReplicas": 1_000_000_000, "replicas": None}, 8, (), "start", 8,
                 id="maxReplicas 10^9 with replicas unset runs at the 8 that fit (issue 21: it used to fail)"),
    pytest.param({"minReplicas": 1_000_000_000, "maxReplicas": 1_000_000_000, "replicas": None}, 8, (), "close", 0,
                 id="minReplicas 10^9 can never fit: fails at once"),
    pytest.param({"minReplicas": 1, "maxReplicas": 8, "replicas": 8, "nprocPerNode": 2}, 8, (), "start", 4,
                 id="min 1 max 8 at 2 per node under a cap of 8 runs 4 agents"),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "cap", "workers", "expected", "started"), CAPACITY)
def test_the_local_process_cap_is_checked_before_any_worker_starts(spec, cap, workers, expected, started) -> None:
    actions = reconcile(Observed(job(**spec), RUNNING, workers, process_cap=cap))
    kinds = {"start": [StartWorkers], "close": [CloseJob], "none": []}[expected]
    assert [type(a) for a in actions] == kinds, actions
    if expected == "close":
        assert actions[0].reason == "TooManyLocalProcesses" and f"more than the {cap}" in actions[0].message
        assert "spec.minReplicas" in actions[0].message
    if expected == "start":
        assert actions[0].count == started


def test_a_job_waits_while_other_jobs_hold_the_machine_and_grows_when_they_end() -> None:
    spec = job(minReplicas=2, maxReplicas=4, replicas=4)
    assert reconcile(Observed(spec, RUNNING, (), process_cap=8, processes_elsewhere=7)) == [], "1 slot < min 2"
    assert reconcile(Observed(spec, RUNNING, (), process_cap=8, processes_elsewhere=5)) == [StartWorkers(3)]
    two = (alive("w1"), alive("w2"))
    assert reconcile(Observed(spec, RUNNING, two, process_cap=8, processes_elsewhere=6)) == []
    assert reconcile(Observed(spec, RUNNING, two, process_cap=8, processes_elsewhere=0)) == [StartWorkers(2)]


STUCK = WorkerObservation("w2", True, started_at=100.0, ready=False, waiting="ImagePullBackOff: no", pending=True)
GATHERING = JobState(run_id="r", round=Round(0), budget=Budget(3))  # no round sealed yet: the job never trained
UNSCHEDULABLE = WorkerObservation("w2", True, started_at=100.0, ready=False, pending=True,
                                  waiting="Unschedulable: 0/4 nodes are available")
GATED = WorkerObservation("w2", True, started_at=100.0, ready=False, pending=True, waiting="SchedulingGated")


@pytest.mark.parametrize(
    ("spec", "now", "expected"),
    [
        pytest.param({}, 699.0, [], id="the default 600 s have not passed: nothing"),
        pytest.param({}, 700.0, ["StartupTimeout"], id="600 s after the pod was created the job fails"),
        pytest.param({"startupTimeoutSeconds": 3600}, 700.0, [], id="a longer startupTimeoutSeconds waits longer"),
        pytest.param({"minReplicas": 1}, 1e6, [], id="minReplicas ready: the job trains and the worker waits"),
    ],
)
def test_a_worker_that_never_starts_fails_the_job_only_when_it_cannot_train(spec, now, expected) -> None:
    actions = reconcile(observed(state=GATHERING, workers=(alive("w1"), STUCK), spec=job(**spec), now=now))
    assert [a.reason for a in actions if isinstance(a, CloseJob)] == expected
    if expected:
        (close,) = actions
        assert "worker w2" in close.message and "ImagePullBackOff" in close.message


@pytest.mark.parametrize(
    ("workers", "since", "now", "spec", "expected"),
    [
        pytest.param((alive("w1"), UNSCHEDULABLE), None, 1e6, {}, [],
                     id="a job that trained and lost a worker to an unschedulable pod waits, never StartupTimeout"),
        pytest.param((alive("w1"), GATED), 1000.0, 1000.0 + 3599, {}, [],
                     id="a SchedulingGated pod is waiting: within the default hour nothing fails"),
        pytest.param((alive("w1"), UNSCHEDULABLE), 1000.0, 1000.0 + 3600, {}, ["CapacityTimeout"],
                     id="an hour below min after it began: CapacityTimeout"),
        pytest.param((alive("w1"), UNSCHEDULABLE), 1000.0, 1e9, {"capacityTimeoutSeconds": 0}, [],
                     id="capacityTimeoutSeconds 0 waits forever"),
        pytest.param((alive("w1"), alive("w2")), 1000.0, 1e9, {}, [],
                     id="back at min: no wait, nothing fails"),
    ],
)  # fmt: skip
def test_below_min_after_training_is_a_free_wait_bounded_by_its_own_timeout(workers, since, now, spec, expected):
    seen = Observed(job(**spec), RUNNING, workers, now=now, capacity_wait_since=since)
    assert [a.reason for a in reconcile(seen) if isinstance(a, CloseJob)] == expected
    if expected:
        assert "spec.capacityTimeoutSeconds (3600 s)" in reconcile(seen)[-1].message
    assert not any(isinstance(a, HandleExit) for a in reconcile(seen)), "waiting is never charged"


def test_a_job_waiting_for_capacity_says_so_and_when_it_began() -> None:
    seen = Observed(job(), RUNNING, (alive("w1"), UNSCHEDULABLE), now=5000.0)
    status = job_status(seen, None, None)
    assert status["reason"] == "WaitingForCapacity" and "1 of minReplicas 2" in status["message"], status
    waiting = next(c for c in status["conditions"] if c["type"] == "WaitingForCapacity")
    assert (waiting["status"], waiting["reason"]) == ("True", "Unschedulable"), waiting
    assert condition_since(status, "WaitingForCapacity") == 5001.0, "whole seconds: the end of the second"
    back = job_status(Observed(job(), RUNNING, TWO_ALIVE, now=6000.0), status, None)
    assert condition_since(back, "WaitingForCapacity") is None and back["reason"] == "RoundSealed"


def test_a_job_running_below_its_desired_size_for_want_of_room_says_so() -> None:
    spec = job(minReplicas=1, maxReplicas=8, replicas=8, nprocPerNode=2)
    four = tuple(alive(f"w{i}") for i in range(4))
    status = job_status(Observed(spec, RUNNING, four, process_cap=8), None, None)
    (limited,) = [c for c in status["conditions"] if c["type"] == "CapacityLimited"]
    assert limited["status"] == "True" and "4 of 8 wanted worker(s) fit" in limited["message"], limited


def test_spares_are_started_beyond_the_desired_size_and_kept_out_of_the_active_count() -> None:
    spec = job(replicas=2, spares=1)
    assert reconcile(Observed(spec, RUNNING, ())) == [StartWorkers(3)]
    three = (*TWO_ALIVE, WorkerObservation("w3", True))
    assert reconcile(Observed(spec, RUNNING, three)) == [], "two members and a spare: nothing to do"
    waiting = JobState(**{**RUNNING.__dict__, "members": {**RUNNING.members, "w3-33-cc": Member("w3-33-cc", 5)}})
    status = job_status(Observed(spec, waiting, three), None, None)
    assert status["spares"] == {"wanted": 1, "ready": 1} and status["replicas"] == {"desired": 2, "active": 2}


def external(state=RUNNING, workers=TWO_ALIVE, spec=None, started_at=None, now=1000.0):
    return Observed(spec or job(), state, tuple(workers), started_at=started_at, now=now, external_workers=True)


@pytest.mark.parametrize(
    ("case", "seen", "expected"),
    [
        ("no run yet: created with the spec's budget", external(state=JobState()), [InitRun()]),
        ("fewer than desired: the platform starts workers", external(workers=(alive("w1"),)), []),
        ("more than desired: extra agents are spares", external(workers=(*TWO_ALIVE, alive("w3"))), []),
        ("none at all after training: waiting, free", external(workers=()), []),
        ("closed: the agents read `closed` and exit", external(state=JobState(
            run_id="r", round=SEALED, closed=Closed("BackoffLimitExceeded", "spent", 1.0))), []),
        ("an exit seen by nobody but the agents", external(workers=(alive("w1"), exited("w2", 1))), []),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_workers_the_platform_runs_are_never_started_stopped_or_replaced(case, seen, expected) -> None:
    assert reconcile(seen) == expected, case


def test_external_workers_still_end_the_job_by_deadline_and_capacity_timeout() -> None:
    late = external(spec=job(activeDeadlineSeconds=60), started_at=0.0, now=100.0)
    assert [type(a) for a in reconcile(late)] == [CloseJob]
    gone = Observed(job(capacityTimeoutSeconds=30), RUNNING, (), now=1000.0, capacity_wait_since=900.0,
                    external_workers=True)
    (close,) = reconcile(gone)
    assert isinstance(close, CloseJob) and "capacityTimeoutSeconds" in close.message


def test_a_closed_job_waits_for_no_capacity_even_with_every_agent_gone() -> None:
    """Agents a platform runs exit when their job ends: zero of them is the end, not a wait for capacity."""
    done = JobState(run_id="r", round=SEALED, budget=Budget(3), closed=Closed("Succeeded", "all done", 1.0))
    for seen in (external(state=done, workers=()), observed(state=done, workers=())):
        conditions = job_status(seen, None, None)["conditions"]
        assert not any(c["type"] == "WaitingForCapacity" and c["status"] == "True" for c in conditions), conditions


def test_a_scale_down_with_a_spare_stops_a_member_beyond_the_new_size_not_the_spare() -> None:
    """replicas 3 -> 2 with spares 1: the round holds w1..w3 and w4 waits as the spare (the newest). Stopping
    w4 would leave the job training at 3 with no spare; stopping w3 re-forms the round at 2 and keeps w4."""
    at_three = Round(5, sealed=True, members={"w1-11-aa": 0, "w2-22-bb": 1, "w3-33-cc": 2})
    members = {m: Member(m, 5) for m in at_three.members} | {"w4-44-dd": Member("w4-44-dd", 6)}
    state = JobState(run_id="r", round=at_three, budget=Budget(3), members=members)
    workers = tuple(alive(f"w{i}", float(i)) for i in range(1, 5))
    assert reconcile(Observed(job(replicas=2, spares=1), state, workers)) == [
        StopWorker("w3", "ScaleDown", "w3-33-cc", 5)]
    # no member beyond the size: the newest goes, as before (a spare, or a newcomer not yet in the round)
    assert reconcile(Observed(job(replicas=3, spares=0), state, workers)) == [
        StopWorker("w4", "ScaleDown", "w4-44-dd", 5)]


@pytest.mark.parametrize(
    ("seen", "due"),
    [
        pytest.param(observed(), None, id="a healthy job with no deadline: only an event changes anything"),
        pytest.param(observed(spec=job(activeDeadlineSeconds=600), started_at=900.0, now=1000.0), 500.0,
                     id="the active deadline, from the job's start"),
        pytest.param(observed(spec=job(activeDeadlineSeconds=600), now=1000.0), 600.0,
                     id="a job starting now: its deadline is a whole activeDeadlineSeconds away"),
        pytest.param(observed(spec=job(activeDeadlineSeconds=60), started_at=0.0, now=1000.0), 0.0,
                     id="a deadline past is due now"),
        pytest.param(observed(state=GATHERING, workers=(alive("w1"), STUCK), now=400.0), 300.0,
                     id="a starting worker's startupTimeoutSeconds (600 s from its creation at 100)"),
        pytest.param(observed(state=GATHERING, workers=(alive("w1"), STUCK), spec=job(minReplicas=1), now=400.0),
                     None, id="minReplicas ready: no startup timeout to wait for"),
        pytest.param(Observed(job(), RUNNING, (alive("w1"), UNSCHEDULABLE), now=2000.0, capacity_wait_since=1000.0),
                     2600.0, id="below min after training: the capacity timeout (an hour) from when the wait began"),
        pytest.param(Observed(job(), RUNNING, (alive("w1"), UNSCHEDULABLE), now=2000.0), 3600.0,
                     id="a wait whose condition is not written yet began now"),
        pytest.param(Observed(job(capacityTimeoutSeconds=0), RUNNING, (alive("w1"), UNSCHEDULABLE), now=2000.0),
                     None, id="capacityTimeoutSeconds 0 waits forever: nothing falls due"),
        pytest.param(Observed(job(activeDeadlineSeconds=7200), RUNNING, (alive("w1"), UNSCHEDULABLE), now=2000.0,
                              started_at=0.0, capacity_wait_since=1900.0), 3500.0, id="the earliest of several"),
        pytest.param(observed(state=JobState(**{**RUNNING.__dict__, "closed": Closed("Succeeded", "done")}),
                              spec=job(activeDeadlineSeconds=1), started_at=0.0), None,
                     id="a closed job: nothing falls due (its wind-down follows its workers)"),
        pytest.param(observed(state=JobState(), spec=job(activeDeadlineSeconds=1)), None,
                     id="no run yet: reconcile acts now, not later"),
    ],
)  # fmt: skip
def test_seconds_until_due_is_when_time_alone_may_change_the_decision(seen: Observed, due: float | None) -> None:
    """What the controller requeues a job for instead of polling it; checked against reconcile itself: nothing
    changes a moment before the time due, something does at it."""
    assert seconds_until_due(seen) == due
    if due:
        # What this step writes to the status: the job's start time and when its wait began, if not known yet.
        written = {**seen.__dict__, "started_at": seen.started_at if seen.started_at is not None else seen.now,
                   "capacity_wait_since": seen.capacity_wait_since or seen.now}
        before = Observed(**{**written, "now": seen.now + due - 1.0})
        at = Observed(**{**written, "now": seen.now + due})
        assert reconcile(before) == reconcile(seen) != reconcile(at)
