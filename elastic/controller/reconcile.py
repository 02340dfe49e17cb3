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
from elastic.policy.capacity import (
    AGENTS_MISSING,
    CapacityWait,
    LocalFit,
    capacity_due,
    capacity_timed_out,
    capacity_wait,
    local_fit,
)
from elastic.policy.deadline import deadline_exceeded, deadline_remaining
from elastic.policy.incident import Failure, Incident, JobEnd, RoundEnd, incident_of
from elastic.policy.startup import startup_due, startup_timed_out
from elastic.rendezvous.state import JobState
from elastic.spec import ElasticJob, SuccessPolicy


@dataclass(frozen=True)
class Observed:
    job: ElasticJob
    state: JobState
    workers: tuple[WorkerObservation, ...]
    started_at: float | None = None  # when the controller first saw the job (status.startTime)
    now: float = field(default_factory=time.time)
    process_cap: int | None = None  # the machine's training processes for all jobs (local); None: no cap
    processes_elsewhere: int = 0  # training processes other jobs of this controller run (local)
    capacity_wait_since: float | None = None  # since when the job waits for capacity (its condition's time)
    # The platform starts and stops the workers (compose's `--scale`, a batch system, agents run by hand): the
    # controller observes them through their member keys and decides the job's end, never starts, stops or
    # replaces one. Their agents report their own exits to etcd, as under stock torchrun.
    external_workers: bool = False

    @property
    def trained(self) -> bool:
        """A round of this run sealed once: below min is a wait for capacity from now on, not a slow start."""
        current = self.state.round
        return current is not None and (current.sealed or current.number > 0)


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


def seconds_until_due(observed: Observed) -> float | None:
    """Seconds until time alone may change what `reconcile` decides: the active deadline, a starting worker's
    startup timeout or the capacity timeout falling due. None: only an event (a worker, a key in etcd, the
    spec) can change it. A controller requeues the job then, and otherwise waits for its watches: it never
    reconciles a job that nothing happened to."""
    state, spec, now = observed.state, observed.job.spec, observed.now
    if state.run_id is None or state.closed is not None:
        return None  # a run not created yet is an action now; a closed job's wind-down follows its workers
    due = [deadline_remaining(observed.started_at if observed.started_at is not None else now, now,
                              spec.active_deadline_seconds)]
    if not observed.trained:
        due.append(startup_due(observed.workers, now, spec.startup_timeout_seconds, spec.min_replicas))
    if waiting_for_capacity(observed) is not None:
        due.append(capacity_due(observed.capacity_wait_since, now, spec.capacity_timeout_seconds))
    known = [max(d, 0.0) for d in due if d is not None]
    return min(known) if known else None


def reconcile(observed: Observed) -> list[ControllerAction]:
    state, spec = observed.state, observed.job.spec
    if state.run_id is None:
        return [InitRun()]
    if state.closed is not None:
        return [] if observed.external_workers else _wind_down(observed)  # external agents read `closed`
    if deadline_exceeded(observed.started_at, observed.now, spec.active_deadline_seconds):
        return [CloseJob(JobEnd.DEADLINE_EXCEEDED, f"activeDeadlineSeconds ({spec.active_deadline_seconds} s) passed")]
    if not observed.trained:  # startupTimeoutSeconds bounds the time to the first sealed round only
        stuck = startup_timed_out(observed.workers, observed.now, spec.startup_timeout_seconds, spec.min_replicas)
        if stuck:
            return [CloseJob(JobEnd.STARTUP_TIMEOUT, stuck)]
    waiting = waiting_for_capacity(observed)
    if waiting is not None and capacity_timed_out(observed.capacity_wait_since, observed.now,
                                                  spec.capacity_timeout_seconds):
        return [CloseJob(JobEnd.CAPACITY_TIMEOUT, f"{waiting.message} for more than spec.capacityTimeoutSeconds "
                                                  f"({spec.capacity_timeout_seconds} s)")]
    chief = _chief_done(observed)
    if chief is not None:
        return [CloseJob(JobEnd.SUCCEEDED, f"rank 0 ({chief}) finished with exit 0 (successPolicy Rank0)")]
    if observed.external_workers:
        return []

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

    desired = clamp_replicas(spec.replicas, spec.min_replicas, spec.max_replicas) + spec.spares
    running = [w for w in observed.workers if w.alive and not w.stopping]
    missing = desired - len(running) - len(finished)
    if missing > 0 and not finished:
        never = capacity_problem(observed.job, spec.min_replicas, observed.process_cap)
        if never:
            return [*actions, CloseJob(JobEnd.TOO_MANY_PROCESSES, never)]
        fit = fitting(observed)
        if fit.start:
            actions.append(StartWorkers(fit.start))
    elif len(running) > desired:
        for worker in _scale_down_order(running, observed)[: len(running) - desired]:
            member = member_of(worker.name, state.members)
            actions.append(StopWorker(worker.name, RoundEnd.SCALE_DOWN, member, current.number if current else None))
    return actions


def fitting(observed: Observed) -> LocalFit:
    """How many of the workers the job lacks start now: what the machine's process cap leaves (local)."""
    spec = observed.job.spec
    desired = clamp_replicas(spec.replicas, spec.min_replicas, spec.max_replicas) + spec.spares
    running = sum(1 for w in observed.workers if w.alive and not w.stopping)
    finished = sum(1 for w in observed.workers if _finished(w, observed.state))
    return local_fit(desired - running - finished, running, spec.min_replicas, spec.nproc_per_node,
                     observed.process_cap, observed.processes_elsewhere)


def waiting_for_capacity(observed: Observed) -> CapacityWait | None:
    """The job trained before and is below minReplicas now: it waits for capacity (free), and why. A closed job
    waits for nothing (its agents are gone because it ended)."""
    if observed.state.closed is not None:
        return None
    min_replicas = observed.job.spec.min_replicas
    if observed.external_workers:
        running = sum(1 for w in observed.workers if w.alive)
        return capacity_wait(observed.workers, min_replicas, observed.trained,
                             f"{running} agent(s) run; the platform starts them (compose: up --scale worker=N)",
                             AGENTS_MISSING)
    fit = fitting(observed)
    shortfall = fit.limited if fit.start == 0 else None
    return capacity_wait(observed.workers, min_replicas, observed.trained, shortfall)


def capacity_problem(job: ElasticJob, workers: int, process_cap: int | None) -> str | None:
    """Why even `workers` workers of this job (its minReplicas) are more training processes than the machine
    runs, or None: such a job could never run here, so it fails before a single worker starts (a job that fits
    smaller runs at what fits instead, see `fitting`).
    """
    nproc = job.spec.nproc_per_node
    if process_cap is None or workers * nproc <= process_cap:
        return None
    return (
        f"job {job.key} needs at least {workers} worker(s) x nprocPerNode {nproc} = {workers * nproc} training "
        f"processes, more than the {process_cap} this machine runs (--max-local-processes, "
        f"$ELASTIC_MAX_LOCAL_PROCESSES; default 4 per CPU); lower spec.minReplicas or spec.nprocPerNode, or "
        "raise the cap"
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


def _scale_down_order(running: list[WorkerObservation], observed: Observed) -> list[WorkerObservation]:
    """Which workers a scale-down stops first: members of the round beyond the job's new size (newest first),
    then the others, newest first. With spares, the round may hold more members than the new size (a spare was
    taken in at the old one): stopping the spare instead would leave the job training above the size asked
    for, with no spare; stopping a member re-forms the round at the size (a free ScaleDown) and keeps the spare.
    """
    spec, current = observed.job.spec, observed.state.round
    size = clamp_replicas(spec.replicas, spec.min_replicas, spec.max_replicas)
    in_round = [w for w in running if current is not None and member_of(w.name, current.members) is not None]
    beyond = _newest_first(in_round)[: max(len(in_round) - size, 0)]
    return [*beyond, *(w for w in _newest_first(running) if w not in beyond)]


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
