"""Capacity is membership, not failure (docs/design.md §3.17): a job that trained once and then has fewer
than `minReplicas` workers ready waits for capacity; it does not fail.

Spot reclaims, preemption, a drained node, a full machine: the job's workers come and go with capacity that
the job does not control. `startupTimeoutSeconds` is about a job that never got going (a wrong image, a
pod that can never be scheduled) and bounds only the time to the first sealed round. After that, a dip
below min is a wait, free of charge, bounded by a timeout of its own (`capacityTimeoutSeconds`, timed from
the moment the job fell below min; 0 waits forever), and the job says why it waits: the reason of the
first worker that cannot run (Unschedulable, SchedulingGated, ImagePullBackOff, LocalCapacity, ...).
Pure: the controller passes what it observed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from elastic.policy.startup import StartingWorker

WAITING_FOR_CAPACITY = "WaitingForCapacity"  # the condition of a job below min that waits
LOCAL_CAPACITY = "LocalCapacity"  # this machine's process cap is taken (by this job's size or other jobs)
AGENTS_MISSING = "AgentsMissing"  # the platform that starts the agents (compose, a batch system) runs too few
CAPACITY_LIMITED = "CapacityLimited"  # the condition of a job that runs below its desired size


@dataclass(frozen=True)
class CapacityWait:
    """The job trained before and now has fewer than min workers ready: it waits (free) and says why."""

    ready: int
    min_replicas: int
    reason: str  # CamelCase: the first waiting worker's reason, else NotEnoughWorkers
    detail: str  # for people: which worker waits on what

    @property
    def message(self) -> str:
        return (f"{self.ready} of minReplicas {self.min_replicas} worker(s) ready; waiting for capacity "
                f"({self.detail}), free of charge")


def capacity_wait(
    workers: Iterable[StartingWorker], min_replicas: int, trained: bool, local_shortfall: str | None = None,
    shortfall_reason: str = LOCAL_CAPACITY,
) -> CapacityWait | None:
    """Whether a job that trained before is below min now for want of capacity, and why; None when it is not,
    never trained, or nothing says capacity is short (a replacement still starting is a recovery, not a wait).

    `local_shortfall`: why the local machine cannot start the workers the job lacks (its process cap is taken
    by other jobs), as the controller found it; `shortfall_reason` names it (AGENTS_MISSING: nobody here
    starts them, the platform does).
    """
    if not trained:
        return None
    live = [w for w in workers if w.alive and not w.stopping]
    ready = sum(1 for w in live if w.ready and not w.pending)
    if ready >= min_replicas:
        return None
    waiting = sorted((w.name, w.waiting) for w in live if w.waiting)
    if waiting:
        name, why = waiting[0]
        return CapacityWait(ready, min_replicas, why.split(":", 1)[0], f"worker {name}: {why}")
    if local_shortfall:
        return CapacityWait(ready, min_replicas, shortfall_reason, local_shortfall)
    return None


def capacity_timed_out(waiting_since: float | None, now: float, timeout_seconds: int) -> bool:
    """The wait for capacity lasted `capacityTimeoutSeconds` (0: never times out)."""
    return timeout_seconds > 0 and waiting_since is not None and now - waiting_since >= timeout_seconds


def capacity_due(waiting_since: float | None, now: float, timeout_seconds: int) -> float | None:
    """Seconds until a job waiting for capacity times out (None: it never does). A wait whose condition is not
    written yet (`waiting_since` None) began now."""
    if timeout_seconds <= 0:
        return None
    return max((now if waiting_since is None else waiting_since) + timeout_seconds - now, 0.0)


@dataclass(frozen=True)
class LocalFit:
    """How many of the workers a job lacks this machine can start now, and why not more."""

    start: int
    limited: str | None = None  # None: every worker the job wants fits


def local_fit(
    missing: int, running: int, min_replicas: int, nproc: int, cap: int | None, elsewhere: int
) -> LocalFit:
    """Run at what fits (docs/design.md §3.17): start as many of the `missing` workers as the process cap
    leaves room for, once the job then has at least `minReplicas`; otherwise none (a round could not seal,
    the agents would only wait), and the job waits for another job to end.

    `cap`: the machine's training processes for all jobs of this controller (None: no cap, e.g. pods);
    `elsewhere`: processes other jobs run; `running`: this job's live workers.
    """
    if missing <= 0:
        return LocalFit(0)
    if cap is None:
        return LocalFit(missing)
    room = max(cap - elsewhere - running * nproc, 0)
    start = min(missing, room // nproc)
    if running + start < min_replicas:
        start = 0
    if start == missing:
        return LocalFit(start)
    return LocalFit(start, f"{running + start} of {running + missing} wanted worker(s) fit: {elsewhere} of this "
                           f"machine's {cap} training processes run other jobs, each worker needs {nproc}")
