"""What the operator's commands show about one job beyond its status line (`status`, `describe`, `logs`,
`run`): read from etcd into plain data (every value through `elastic.codec`), with the choices made from it
(which worker was the root cause, what the timeline says) as pure functions.

A failed job's status names a member id (`<worker>-<pid>-<hex>`, the agent's) or a worker name (the
controller's); the worker's log is found through `logs/<worker>`, which outlives the worker's own record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastic.cluster.processes import is_worker
from elastic.codec import CorruptValueError, decode_worker, decode_worker_log, status_for_display
from elastic.controller.status import FINAL_PHASES
from elastic.controller.submit import list_jobs
from elastic.policy.budget import Charge
from elastic.policy.incident import JobEnd
from elastic.rendezvous.run import JobRun
from elastic.rendezvous.state import JobState
from elastic.spec import ElasticJob
from elastic.store import JobKeys, Store

log = logging.getLogger(__name__)

TAIL_BYTES = 64 * 1024  # of a log, read from its end: enough for the last lines, never a whole huge file


@dataclass(frozen=True)
class WorkerLog:
    worker: str
    path: str
    started_at: float


@dataclass(frozen=True)
class JobReport:
    """One job as its keys say: spec, status, rendezvous state (budget, closed) and its workers' logs."""

    job: ElasticJob
    status: dict[str, Any]
    state: JobState
    logs: tuple[WorkerLog, ...]  # oldest first

    @property
    def keys(self) -> JobKeys:
        return JobKeys(self.job.metadata.namespace, self.job.metadata.name)


def read_report(store: Store, job: ElasticJob) -> JobReport:
    keys = JobKeys(job.metadata.namespace, job.metadata.name)
    state = JobRun(store, keys).read()
    entry = store.get(keys.status)
    status = status_for_display(keys.status, entry.value if entry else None)
    entries, _ = store.get_prefix(keys.logs_prefix)
    logs = []
    for item in entries:
        try:
            record = decode_worker_log(item.key, item.value)
        except CorruptValueError as err:  # one bad record hides that log only
            log.warning("%s", err)
            continue
        logs.append(WorkerLog(item.key[len(keys.logs_prefix) :], record.path, record.started_at))
    return JobReport(job, status, state, tuple(sorted(logs, key=lambda w: (w.started_at, w.worker))))


def find_job(store: Store, keys: JobKeys) -> ElasticJob | None:
    return next((j for j in list_jobs(store) if (j.metadata.namespace, j.metadata.name) == (keys.namespace,
                                                                                          keys.name)), None)


def live_parts(store: Store, keys: JobKeys) -> list[str]:
    """What of a job is still alive, for people: agents holding a member key (on their own leases, so only
    live ones) and worker processes recorded and running on this machine. [] when nothing is."""
    members, _ = store.get_prefix(keys.members_prefix)
    records, _ = store.get_prefix(keys.workers_prefix)
    running = []
    for entry in records:
        name = entry.key[len(keys.workers_prefix) :]
        try:
            pid = decode_worker(entry.key, entry.value).pid
        except CorruptValueError:
            continue  # no pid to trust
        if is_worker(pid, name):
            running.append(f"{name} (pid {pid})")
    parts = [f"{len(members)} live agent(s)"] if members else []
    return parts + ([f"worker process(es) {', '.join(running)}"] if running else [])


def wait_until_final(store: Store, keys: JobKeys, timeout: float, period: float = 0.2) -> dict[str, Any]:
    """The job's status once a controller made it final and dropped its worker records, or at `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        entry = store.get(keys.status)
        status = status_for_display(keys.status, entry.value if entry else None)
        finished = status.get("phase") in FINAL_PHASES and not store.get_prefix(keys.workers_prefix)[0]
        if finished or time.monotonic() >= deadline:
            return status
        time.sleep(period)


def worker_of(member: str | None, workers: Iterable[str]) -> str | None:
    """The worker a member id belongs to (`<worker>-<pid>-<hex>`), or `member` itself if it is a worker."""
    if member is None:
        return None
    names = set(workers)
    if member in names:
        return member
    return next((w for w in sorted(names) if member.startswith(f"{w}-")), None)


def root_cause_member(state: JobState) -> str | None:
    """The member (or worker) whose failure ended the job: the one a FailJob rule closed it on, or the last
    charge of a spent budget. None when the job did not end on a worker's failure (success, delete, ...)."""
    closed = state.closed
    if closed is None:
        return None
    if closed.member is not None:
        return closed.member
    charges = state.budget.charges if state.budget else ()
    if closed.reason == JobEnd.BACKOFF_LIMIT_EXCEEDED and charges:
        return charges[-1].member
    return None


def failed_worker_log(report: JobReport, include_restarts: bool = False) -> WorkerLog | None:
    """The log of the worker that failed the job; with `include_restarts`, else of the last charged failure."""
    member = root_cause_member(report.state)
    if member is None and include_restarts and report.state.budget and report.state.budget.charges:
        member = report.state.budget.charges[-1].member
    by_worker = {w.worker: w for w in report.logs}
    worker = worker_of(member, by_worker)
    return by_worker.get(worker) if worker else None


def tail(path: str | Path, lines: int) -> list[str]:
    """The last `lines` lines of a file (read from its end only); [] when it cannot be read."""
    try:
        with Path(path).open("rb") as file:
            size = file.seek(0, 2)
            file.seek(max(size - TAIL_BYTES, 0))
            text = file.read().decode("utf-8", "replace")
    except OSError:
        return []
    return text.splitlines()[-lines:] if lines > 0 else []


@dataclass(frozen=True)
class Event:
    """One line of a job's timeline: derived from its conditions and its budget's charges (there is no
    event store locally), so each says only what those records say, with their times."""

    at: str  # UTC, as the status writes times
    kind: str  # Normal | Warning, as Kubernetes Events
    reason: str
    message: str


def timeline(status: dict[str, Any], charges: Iterable[Charge], timestamp: Any) -> list[Event]:
    """Events in time order: the controller taking the job up, each condition's last transition to True
    (the last one is the completion), each charge.

    `timestamp` formats a charge's epoch seconds as the status does. Only a condition's *last* transition
    is known (an earlier Running before a Restarting is not recorded): the timeline says no more.
    """
    events = [
        Event(c["lastTransitionTime"], "Warning" if c["type"] in ("Failed", "Restarting") else "Normal",
              c.get("reason") or c["type"], c.get("message", ""))
        for c in status.get("conditions", [])
        if c.get("status") == "True" and c.get("lastTransitionTime")
    ]  # fmt: skip
    if status.get("startTime"):
        events.append(Event(status["startTime"], "Normal", "Started", "a controller took the job up"))
    for charge in charges:
        events.append(Event(timestamp(charge.at), "Warning", charge.reason,
                            f"round {charge.round} ended: {charge.cause}; charged to the restart budget"))
    return sorted(events, key=lambda e: e.at)
