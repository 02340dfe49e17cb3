"""What the controller benchmarks (`kube_api.py`, `local_jobs.py`) measure of the controller itself: which jobs it
reconciled and when, its resident memory, the spread of change -> reconcile times."""

from __future__ import annotations

import math
import time
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
