"""Printing what several verbs show about a job: its root cause, its age, the controller hint."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from elastic.codec import leader_holder
from elastic.controller.inspect import JobReport, failed_worker_log, find_job, live_parts, tail
from elastic.controller.status import parse_timestamp
from elastic.errors import PermanentError
from elastic.spec import ElasticJob
from elastic.store import JobKeys, PrefixWatch, Store
from elastic.store.keys import controller_leader_key

ROOT_CAUSE_LINES = 10
# How long submit and scale wait for a leader before warning that none runs: a controller started a moment
# before (`elastic controller &` then `elastic submit`) wins its election within about a second.
ELECTION_WAIT_SECONDS = 3.0


def root_cause_lines(report: JobReport, lines: int = ROOT_CAUSE_LINES, include_restarts: bool = False) -> list[str]:
    """The failing worker's own error (as its agent captured it, from any machine), then its log path and its
    last lines; [] if no worker failed the job."""
    closed = report.state.closed
    error = [f"  | {line}" for line in (closed.error or "").splitlines()[-lines:]] if closed else []
    found = failed_worker_log(report, include_restarts)
    if found is None:
        return [f"worker {closed.member} error:", *error] if error and closed and closed.member else []
    head = f"worker {found.worker} log: {found.path}"
    mine = [f"worker {found.worker} error:", *error] if error else []
    last = tail(found.path, lines)
    if not last:
        return [*mine, f"{head} (not readable here: 'elastic logs {report.job.key} --worker {found.worker}' "
                       "on its machine)"]
    return [*mine, f"{head} (last {len(last)} lines):", *(f"  | {line}" for line in last)]


def require_job(store: Store, keys: JobKeys, endpoints: str) -> ElasticJob:
    """The job these keys name, or one line saying that etcd has no such job."""
    job = find_job(store, keys)
    if job is None:
        raise PermanentError(f"no job {keys.namespace}/{keys.name} in etcd at {endpoints}")
    return job


def age(status: dict[str, Any], now: float | None = None) -> str:
    """kubectl's AGE, from the time a controller took the job up (status.startTime): 45s, 12m, 3h, 2d."""
    start = status.get("startTime")
    if not isinstance(start, str):
        return "-"
    try:
        seconds = max(int((now or time.time()) - parse_timestamp(start)), 0)
    except ValueError:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def controller_leading(store: Store, wait: float = 0.0) -> dict[str, Any] | None:
    """What the leader key (the local controllers' heartbeat: it lives on the leader's 5 s lease) says about
    the acting controller; None when no controller runs against this etcd, or none won within `wait` s."""
    key = controller_leader_key()
    entries, revision = store.get_prefix(key)
    entry = next((e for e in entries if e.key == key), None)
    if entry is None and wait > 0:
        deadline = time.monotonic() + wait
        with PrefixWatch(store, key, start_revision=revision + 1) as watch:
            while entry is None and (left := deadline - time.monotonic()) > 0:
                event = watch.get(timeout=left)
                if event is not None and event.key == key and event.kind == "put":
                    entry = store.get(key)
    if entry is None:
        return None
    holder, info = leader_holder(entry.key, entry.value)
    return {**info, "holder": holder}


def warn_without_controller(store: Store, endpoints: str, what: str, keys: JobKeys | None = None) -> None:
    """One `warning:` line when nothing will act on a job, or only an `elastic run` busy with another one
    (`keys`: the job; when it has live agents or workers under an acting `elastic run`, that run is its)."""
    leader = controller_leading(store, wait=ELECTION_WAIT_SECONDS)
    if leader is not None and leader.get("role") == "run" and keys is not None and live_parts(store, keys):
        return
    if leader is None:
        print(f"warning: no controller is running against {endpoints} (no leader key {controller_leader_key()}): "
              f"{what} once one runs: elastic controller --etcd {endpoints}", file=sys.stderr)
    elif leader.get("role") == "run":
        print(f"warning: the acting controller is an 'elastic run' ({leader['holder']}), which runs only its own "
              f"job: {what} after it ends, under an 'elastic controller --etcd {endpoints}' (one standing by "
              "takes over then)", file=sys.stderr)


def columns(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "") -> list[str]:
    """Rows aligned under a header, as kubectl prints tables."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
            for r in [header, *rows]]  # fmt: skip
