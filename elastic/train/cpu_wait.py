"""How long this process's threads waited for a CPU (Linux's per-thread `run_delay`, in
/proc/self/task/<tid>/schedstat): what the hang watchdog subtracts from a step's wall time, so that a machine
loaded by other processes slows a step without charging it (`elastic.policy.hang.runnable_elapsed`).

Read by the watchdog's own thread, never on the training thread's path, and only while a step runs.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

TASKS = Path("/proc/self/task")  # "self": the process that reads it (a worker is a fork of its zygote)


def run_delays() -> dict[int, float]:
    """Seconds each thread of this process has spent runnable but not running, since it started. Empty where
    the kernel keeps no schedstats: then nothing is subtracted and the watchdog is wall-clock, as before."""
    delays: dict[int, float] = {}
    with contextlib.suppress(OSError):
        for task in TASKS.iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                delays[int(task.name)] = int((task / "schedstat").read_text().split()[1]) / 1e9
    return delays


class CpuWait:
    """The longest wait for a CPU of any thread of this process (but the watchdog's own) since `restart`.

    Created on the watchdog's thread: that thread's own waits (it wakes ten times a second, and waits for a
    CPU like everyone on a loaded machine) say nothing of the step's progress."""

    def __init__(self) -> None:
        self._own = threading.get_native_id()
        self._base: dict[int, float] = {}

    def restart(self) -> None:
        self._base = run_delays()

    def waited(self) -> float:
        now = run_delays()
        return max((delay - self._base.get(tid, 0.0) for tid, delay in now.items() if tid != self._own), default=0.0)
