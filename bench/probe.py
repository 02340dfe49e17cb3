"""What the controller benchmarks (`kube_api.py`, `local_jobs.py`) measure of the controller itself: which jobs it
reconciled and when, its resident memory, the spread of change -> reconcile times."""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class JobSteps:
    """Counts `JobController.step` calls, one job reconciled once (the unit of work of both versions), and
    when each job's steps ended (monotonic), for change -> reconcile."""

    def __init__(self) -> None:
        from elastic.controller.loop import JobController

        self.count = 0
        self.ended: dict[str, list[float]] = {}
        original = JobController.step

        def step(controller: Any, *args: Any, **kwargs: Any) -> Any:
            self.count += 1  # the manager's pass loop calls it, on one thread
            try:
                return original(controller, *args, **kwargs)
            finally:
                self.ended.setdefault(controller.job.metadata.name, []).append(time.monotonic())

        JobController.step = step  # type: ignore[method-assign]

    def first_after(self, job: str, t: float) -> float | None:
        return next((e for e in self.ended.get(job, []) if e > t), None)


def rss_mib() -> tuple[float, float]:
    """This process's resident set now and at its peak (VmRSS, VmHWM), MiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return tuple(int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM"))  # type: ignore[return-value]


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile, nearest rank (with 40 changes, p99 is the slowest)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def latency_text(values: list[float]) -> str:
    return f"{percentile(values, 50):.3f}, {percentile(values, 99):.3f}, {max(values):.3f}; n={len(values)}"


class ChildProcess:
    """A benchmark's helper process (spawned) and the parent's handle on it: start, ask, stop. The child sends
    one first message when ready (kept as `first`), then answers each request; ("stop",) ends it."""

    def __init__(self, target: Callable[..., None], args: tuple[Any, ...], name: str, answer_seconds: float,
                 join_seconds: float) -> None:
        context = mp.get_context("spawn")
        self.conn, child = context.Pipe()
        self.name, self.answer_seconds, self.join_seconds = name, answer_seconds, join_seconds
        self.process = context.Process(target=target, args=(*args, child), daemon=True)
        self.process.start()
        if not self.conn.poll(60):
            raise RuntimeError(f"{name} did not start within 60 s")
        self.first: Any = self.conn.recv()

    def ask(self, *message: Any) -> Any:
        self.conn.send(message)
        if not self.conn.poll(self.answer_seconds):
            raise RuntimeError(f"{self.name} did not answer {message[0]!r} within {self.answer_seconds:g} s")
        return self.conn.recv()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(("stop",))
        self.process.join(self.join_seconds)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
