"""One watch of every job's keys in etcd, turned into work-queue entries: what makes a controller act when a
job changes, and only then, instead of reading every job on a timer.

An agent's report, a lost lease, a joiner, a charge or a close shows under the job's deciding keys: the job is
queued at once. Rank 0's progress decides nothing, but shows in the job's status: the job is queued within
`PROGRESS_SECONDS` of it (a training job is reconciled every few seconds for it, an idle one never). The
agents' torch store, the controller's own writes (status, worker records) and incident answers queue nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from elastic.controller.machinery.workqueue import WorkQueue
from elastic.errors import ElasticError
from elastic.store import Store
from elastic.store.keys import job_keys_prefix
from elastic.store.watch import PrefixWatch

log = logging.getLogger(__name__)

DECIDING_KEYS = frozenset({"round", "members", "closed", "budget", "departed", "done", "exits", "incidents"})
PROGRESS_SECONDS = 5.0

DUE_MARGIN_SECONDS = 0.05  # a job requeued for a deadline is handled just after it, not a hair before

JobKey = tuple[str, str]  # (namespace, name)


def queue_when_due(queue: WorkQueue, job: JobKey, due_in: float | None) -> None:
    """Queue `job` when a deadline or timeout of its own falls due (`reconcile.seconds_until_due`); nothing when
    none does: then only an event queues it again."""
    if due_in is not None:
        queue.add_after(job, due_in + DUE_MARGIN_SECONDS)


def queue_entry(relative_key: str, deciding: frozenset[str]) -> tuple[JobKey, float] | None:
    """(the job, after how many seconds to queue it) for a change of `relative_key` (a key below the jobs'
    prefix: `<namespace>/<name>/<what>[/...]`); None when the change decides nothing."""
    parts = relative_key.split("/")
    if len(parts) < 3 or not parts[0] or not parts[1]:
        return None
    job = (parts[0], parts[1])
    if parts[2] in deciding:
        return job, 0.0
    if len(parts) == 3 and parts[2] == "progress":
        return job, PROGRESS_SECONDS
    return None


class JobEvents:
    """Follows every job's keys on a thread, queueing the jobs they change in `queue`.

    `deciding`: the key names (under a job) whose change queues it at once. On a watch failure the watch
    starts again, after `on_lost()` (queue whatever was missed meanwhile).
    """

    def __init__(self, store: Store, queue: WorkQueue, on_lost: Callable[[], None],
                 deciding: frozenset[str] = DECIDING_KEYS) -> None:
        self.store = store
        self.queue = queue
        self.on_lost = on_lost
        self.deciding = deciding
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="etcd-jobs-watch", daemon=True)

    def start(self) -> JobEvents:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)

    def _follow(self) -> None:
        prefix = job_keys_prefix()
        while not self._closed.is_set():
            try:
                with PrefixWatch(self.store, prefix) as watch:
                    while not self._closed.is_set():
                        event = watch.get(timeout=0.5)
                        entry = queue_entry(event.key[len(prefix):], self.deciding) if event is not None else None
                        if entry is not None:
                            self.queue.add_after(*entry)
            except ElasticError as err:
                log.warning("etcd watch of %s: %s; watching again", prefix, err)
                self.on_lost()
                self._closed.wait(1.0)
