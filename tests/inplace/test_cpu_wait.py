"""The hang watchdog's clock on a loaded CPU (issue 44): a worker starved by other processes waits for a CPU
most of its wall time, and that wait is what the watchdog subtracts; a deadlocked worker waits for none, so
its wall time counts whole. Real processes pinned to one CPU with busy loops, so the load is certain."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from elastic.train.cpu_wait import CpuWait, run_delays

pytestmark = pytest.mark.skipif(not run_delays(), reason="the kernel keeps no schedstats (/proc/self/task/*/schedstat)")

BUSY_LOOPS = 3


@pytest.fixture
def one_loaded_cpu() -> Iterator[None]:
    """This process and BUSY_LOOPS busy loops on one CPU: a runnable thread here gets about a quarter of it."""
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    busy = f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
    loops = [subprocess.Popen([sys.executable, "-c", busy]) for _ in range(BUSY_LOOPS)]
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
        for loop in loops:
            loop.kill()
            loop.wait()


def measure(step: Callable[[], None]) -> tuple[float, float]:
    """(wall seconds, longest wait for a CPU) of `step` on a thread of its own, read as the watchdog reads it:
    from another thread (whose own waits do not count), while the step's thread still lives."""
    clocks: list[CpuWait] = []
    watchdog = threading.Thread(target=lambda: clocks.append(CpuWait()))
    watchdog.start()
    watchdog.join()
    clock = clocks[0]
    clock.restart()
    read: dict[str, float] = {}

    def run() -> None:
        started = time.monotonic()
        step()
        read["wall"], read["waited"] = time.monotonic() - started, clock.waited()

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    return read["wall"], read["waited"]


def test_a_starved_step_waits_for_a_cpu_most_of_its_wall_time(one_loaded_cpu: None) -> None:
    def compute() -> None:
        deadline = time.thread_time() + 0.5  # half a second of this thread's own CPU
        while time.thread_time() < deadline:
            pass

    wall, waited = measure(compute)
    assert wall > 1.0, "the busy loops should slow the step"
    assert waited > 0.5 * wall, f"waited {waited:.2f} s of {wall:.2f} s wall"
    assert wall - waited < 0.5 + 0.5, "what is left is about the step's own CPU time"


def test_a_deadlocked_step_waits_for_no_cpu(one_loaded_cpu: None) -> None:
    lock = threading.Lock()
    lock.acquire()

    def deadlocked() -> None:
        lock.acquire(timeout=1.5)  # blocked, as on a lock no one releases

    wall, waited = measure(deadlocked)
    assert wall >= 1.5
    assert waited < 0.2 * wall, f"waited {waited:.2f} s of {wall:.2f} s wall: a blocked thread is not runnable"
