"""What the controller does next, decided from what it observes: pure, level-triggered, idempotent.

Run twice, or after a crash, a reconcile asks for nothing that was already done: it reads the whole
state (the spec, the workers, the job's keys in etcd) and makes it converge. I/O lives in `loop.py`.
Every action is a small value; `loop.py` maps each action type to the code that performs it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from elastic.cluster import WorkerObservation
from elastic.policy.bounds import clamp_replicas
from elastic.policy.deadline import deadline_exceeded
from elastic.policy.incident import Failure, Incident, JobEnd, RoundEnd, incident_of
from elastic.policy.startup import startup_timed_out
from elastic.rendezvous.state import JobState
from elastic.spec import ElasticJob, SuccessPolicy


@dataclass(frozen=True)
class Observed:
    job: ElasticJob
    state: JobState
    workers: tuple[WorkerObservation, ...]
    started_at: float | None = None  # when the controller first saw the job (status.startTime)
    now: float = field(default_factory=time.time)
    process_cap: int | None = None  # most training processes the workers may run together (local); None: no cap


# --- actions ---


@dataclass(frozen=True)
class InitRun:
    """Create the run in etcd: run record, budget from the spec, first round."""


@dataclass(frozen=True)
class StartWorkers:
    count: int


@dataclass(frozen=True)
class StopWorker:
    name: str
    departure: RoundEnd | None = None  # announced to the others first, so that leaving is not a loss
    member: str | None = None
    round: int | None = None


@dataclass(frozen=True)
class HandleExit:
    """A worker ended: end its round with this incident if that round is still current."""

    worker: str
    incident: Incident
    round: int | None  # the round its member trained in; None when it was in none


@dataclass(frozen=True)
class ForgetWorker:
    name: str


@dataclass(frozen=True)
class CloseJob:
    reason: JobEnd
    message: str


ControllerAction = InitRun | StartWorkers | StopWorker | HandleExit | ForgetWorker | CloseJob


def member_of(worker: str, members: Any) -> str | None:
    """The member id a worker's agent uses: it starts with the worker's name (see the handler)."""
    for member_id in members:
        if member_id.startswith(f"{worker}-") and member_id[len(worker) + 1 :].split("-", 1)[0].isdigit():
            return member_id
    return None


def reconcile(observed: Observed) -> list[ControllerAction]:
    state, spec = observed.state, observed.job.spec
    if state.run_id is None:
        return [InitRun()]
    if state.closed is not None:
        return _wind_down(observed)
    if deadline_exceeded(observed.started_at, observed.now, spec.active_deadline_seconds):
        return [CloseJob(JobEnd.DEADLINE_EXCEEDED, f"activeDeadlineSeconds ({spec.active_deadline_seconds} s) passed")]
    stuck = startup_timed_out(observed.workers, observed.now, spec.startup_timeout_seconds, spec.min_replicas)
    if stuck:
        return [CloseJob(JobEnd.STARTUP_TIMEOUT, stuck)]
    chief = _chief_done(observed)
    if chief is not None:
        return [CloseJob(JobEnd.SUCCEEDED, f"rank 0 ({chief}) finished with exit 0 (successPolicy Rank0)")]

    actions: list[ControllerAction] = []
    current = state.round
    finished = [w for w in observed.workers if _finished(w, state)]
    for worker in observed.workers:
        if worker.alive or worker in finished:
            continue  # an agent that finished stays counted: its job is ending, it is not replaced
        if worker.stopping:
            actions.append(ForgetWorker(worker.name))
            continue
        member = member_of(worker.name, current.members if current else {})
        in_round = current.number if current is not None and current.sealed and member is not None else None
        failure = Failure(worker.exit_code, worker.reason, worker.name, observed.now)
        incident = incident_of(RoundEnd.WORKER_EXITED, failure, spec.failure_policy.rules, spec.restart_policy)
        actions.append(HandleExit(worker.name, incident, in_round))
        actions.append(ForgetWorker(worker.name))

    desired = clamp_replicas(spec.replicas, spec.min_replicas, spec.max_replicas)
    running = [w for w in observed.workers if w.alive and not w.stopping]
    missing = desired - len(running) - len(finished)
    if missing > 0 and not finished:
        too_many = capacity_problem(observed.job, len(running) + missing, observed.process_cap)
        if too_many:
            return [*actions, CloseJob(JobEnd.TOO_MANY_PROCESSES, too_many)]
        actions.append(StartWorkers(missing))
    elif len(running) > desired:
        for worker in _newest_first(running)[: len(running) - desired]:
            member = member_of(worker.name, state.members)
            actions.append(StopWorker(worker.name, RoundEnd.SCALE_DOWN, member, current.number if current else None))
    return actions


def capacity_problem(job: ElasticJob, workers: int, process_cap: int | None) -> str | None:
    """Why `workers` workers of this job would be more training processes than the cap allows, or None.

    Checked before a single worker starts, so a `maxReplicas: 1000000000` with `replicas` unset fails the
    job with this message instead of forking until the machine gives up.
    """
    nproc = job.spec.nproc_per_node
    if process_cap is None or workers * nproc <= process_cap:
        return None
    replicas = "spec.replicas" if job.spec.replicas is not None else "spec.maxReplicas (replicas is unset)"
    return (
        f"job {job.key} needs {workers} worker(s) x nprocPerNode {nproc} = {workers * nproc} training processes, "
        f"more than the {process_cap} this machine runs (--max-local-processes, $ELASTIC_MAX_LOCAL_PROCESSES; "
        f"default 4 per CPU); lower {replicas} or spec.nprocPerNode, or raise the cap"
    )


def _wind_down(observed: Observed) -> list[ControllerAction]:
    """The job is closed: stop what still runs, forget what ended."""
    actions: list[ControllerAction] = []
    for worker in observed.workers:
        if worker.alive and not worker.stopping:
            actions.append(StopWorker(worker.name))
    return actions


def _chief_done(observed: Observed) -> str | None:
    """Under successPolicy Rank0: the member holding rank 0 of the current round reported success."""
    if observed.job.spec.success_policy is not SuccessPolicy.RANK0:
        return None
    current = observed.state.round
    if current is None or not current.sealed:
        return None
    chief = next((m for m, rank in current.members.items() if rank == 0), None)
    if chief is not None and observed.state.done.get(chief) == current.number:
        return chief
    return None


def _newest_first(workers: list[WorkerObservation]) -> list[WorkerObservation]:
    return sorted(workers, key=lambda w: w.started_at, reverse=True)


def _finished(worker: WorkerObservation, state: JobState) -> bool:
    """Ended with exit 0, or (an adopted process, exit unseen) its member left as Finished."""
    if worker.alive:
        return False
    if worker.exit_code is not None:
        return worker.exit_code == 0
    member = member_of(worker.name, state.departed)
    return member is not None and state.departed[member].reason == RoundEnd.FINISHED
