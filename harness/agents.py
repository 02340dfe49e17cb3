"""Real torchrun agents as processes, for tests, benchmarks and demos of the `etcd-v3` backend.

One `AgentProcess` is one `torchrun` (or `elastic agent`) process with its own session, so that a test can
kill the whole agent with its workers (a node loss) or one worker alone (a crash), and read back the
training steps the example script prints.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastic.cluster.processes import descendants_of, training_processes
from elastic.rendezvous.run import JobRun
from elastic.store import JobKeys, Store

EXAMPLE_SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py"
STEP_LINE = re.compile(r"^step=(\d+) loss=([\d.]+) world_size=(\d+) restart=(\d+) time=([\d.]+)$", re.M)


@dataclass(frozen=True)
class Step:
    step: int
    loss: float
    world_size: int
    restart: int
    time: float


def parse_steps(text: str) -> list[Step]:
    """The step lines `examples/train_ddp.py` prints (rank 0), in the order printed."""
    return [Step(int(m[1]), float(m[2]), int(m[3]), int(m[4]), float(m[5])) for m in STEP_LINE.finditer(text)]


def seconds_until(condition: Callable[[], object], timeout: float, poll: float = 0.1) -> float:
    """Seconds until `condition` held (for tests that bound how long something takes); fails after `timeout`."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(poll)
    return time.monotonic() - start


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.1) -> bool:
    """Poll `predicate` until it is truthy or `timeout` passes: the only way tests wait."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def torchrun_command(
    endpoint: str,
    run_id: str,
    nnodes: str,
    script_args: Sequence[str],
    conf: dict[str, object] | None = None,
    backend: str = "etcd-v3",
    nproc_per_node: int = 1,
    max_restarts: int = 100,
    launcher: Sequence[str] = (sys.executable, "-m", "torch.distributed.run"),
    script: Path = EXAMPLE_SCRIPT,
    module: str | None = None,
    local_addr: str = "127.0.0.1",
) -> list[str]:
    """torchrun's command line for one agent; `module`: run `python -m module` instead of `script`."""
    command = [
        *launcher,
        f"--rdzv-backend={backend}",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={run_id}",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        f"--max-restarts={max_restarts}",
        "--monitor-interval=0.2",
        f"--local-addr={local_addr}",
    ]
    if conf:
        command.append("--rdzv-conf=" + ",".join(f"{k}={v}" for k, v in conf.items()))
    entry = ["-m", module] if module else [str(script)]
    return [*command, *entry, *script_args]


class AgentProcess:
    """One agent process (torchrun or compatible) with its output in a log file."""

    def __init__(self, command: Sequence[str], log_path: Path, env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        self.command = list(command)
        self.log_path = log_path
        self.cwd = cwd
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> AgentProcess:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True,
                cwd=self.cwd,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def steps(self) -> list[Step]:
        return parse_steps(self.output())

    def worker_pids(self) -> list[int]:
        """The training processes this agent started (its children, or its zygote's in place)."""
        return training_processes(self.pid)

    def kill_worker(self, sig: int = signal.SIGKILL) -> int:
        """Kill one training process while the agent lives (a worker crash)."""
        pids = self.worker_pids()
        if not pids:
            raise RuntimeError(f"agent {self.pid} has no worker to kill")
        os.kill(pids[0], sig)
        return pids[0]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Kill the agent and its workers at once (a node loss)."""
        if self.process is None or self.process.poll() is not None:
            return
        for pid in [*descendants_of(self.pid), self.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        self.process.wait()

    def wait(self, timeout: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout)

    @property
    def returncode(self) -> int | None:
        return self.process.poll() if self.process else None

    def stop(self) -> None:
        """Leave nothing behind: the agent and its workers (which torch starts in sessions of their own)."""
        self.kill()

    def __enter__(self) -> AgentProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def round_record(store: Store, keys: JobKeys) -> dict[str, Any]:
    """The current round as one mapping, as the tests knew it before the ranks moved to bucket keys
    (docs/design.md §3.20): the stored record plus `members`, `previous` and `expected` from a full read."""
    record = store.get_json(keys.round) or {}
    current = JobRun(store, keys).read().round
    if current is None:
        return record
    return {**record, "members": current.members, "previous": current.previous, "expected": list(current.expected)}
