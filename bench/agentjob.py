"""Real torchrun jobs for the benchmarks: agents as processes, their output read incrementally.

A `BenchJob` is one run id of `examples/train_ddp.py` under stock torchrun, with any backend. It reads
the agents' logs as they grow (never whole files: the machine has two cores and the benchmark must not
eat them) and answers the questions the benchmarks ask: when was the first step of a new round, which
agent hosts the c10d store, which worker failures were logged.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench import common
from harness.agents import EXAMPLE_SCRIPT, AgentProcess, Step, torchrun_command

STARTED = re.compile(r"^started rank=(\d+) world_size=(\d+) resumed_from=(\d+)$")
STEP = re.compile(r"^step=(\d+) loss=([\d.]+) world_size=(\d+) restart=(\d+) time=([\d.]+)$")
# torch's agent logs every failed worker: "failed (exitcode: -9) local_rank: 0 (pid: 13701) of binary: ..."
FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
POLL = 0.1


@dataclass(frozen=True)
class Failure:
    agent: int
    exit_code: int
    pid: int
    seen_at: float  # when the benchmark read the line (within POLL of the agent logging it)


@dataclass
class LogTail:
    """The new lines of one agent's log since the last poll."""

    path: Path
    agent: int
    offset: int = 0
    rest: str = ""
    generation: int = 0  # worker processes this agent started so far (each prints one `started` line)
    steps: list[tuple[int, Step]] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)

    def poll(self) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        if not data:
            return
        self.offset += len(data)
        lines = (self.rest + data.decode(errors="replace")).split("\n")
        self.rest = lines.pop()
        now = time.time()
        for line in lines:
            self.read(line, now)

    def read(self, line: str, now: float) -> bool:
        """One complete line; True if it was one of the lines read here (a subclass reads the others)."""
        m = STEP.match(line)
        if m:
            self.steps.append((self.generation, Step(int(m[1]), float(m[2]), int(m[3]), int(m[4]), float(m[5]))))
            return True
        if STARTED.match(line):
            self.generation += 1
            return True
        f = FAILED.search(line)
        if f:
            self.failures.append(Failure(self.agent, int(f[1]), int(f[3]), now))
            return True
        return False


@dataclass(frozen=True)
class AgentStep:
    agent: int
    generation: int
    step: Step

    @property
    def round_key(self) -> tuple[int, int, int]:
        """(agent, worker generation, `restart` field): a new value means a new round.

        The generation changes when an agent starts new workers (torch counts only failure restarts in the
        `restart` field, not the restarts for a membership change); the `restart` field changes when the
        same worker follows a new round in place (examples/train_inplace.py prints the round there).
        """
        return (self.agent, self.generation, self.step.restart)


class BenchJob:
    """One torchrun job: `add()` agents, `kill` them or their workers, read their steps."""

    def __init__(
        self,
        root: Path,
        backend: str,
        endpoint: str,
        nnodes: str,
        conf: dict[str, object] | None = None,
        step_seconds: float = 0.05,
        checkpoint_every: int = 5,
        steps: int = 1_000_000,
        env: dict[str, str] | None = None,
        label: str = "job",
    ) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.backend = backend
        self.endpoint = endpoint
        self.nnodes = nnodes
        self.conf = dict(conf or {})
        self.env = env or {}
        self.run_id = f"{label}-{time.time_ns() % 10**12}"
        self.script_args = [
            "--steps", str(steps), "--step-seconds", str(step_seconds), "--checkpoint-every",
            str(checkpoint_every), "--checkpoint-dir", str(root / "checkpoints"),
        ]
        self.agents: list[AgentProcess] = []
        self.tails: list[LogTail] = []
        self.tail_type = LogTail
        self.launched_at: list[float] = []

    @property
    def port(self) -> int | None:
        if self.backend == "etcd-v3":
            return None
        return int(self.endpoint.rsplit(":", 1)[1])

    def command(self) -> list[str]:
        return torchrun_command(self.endpoint, self.run_id, self.nnodes, self.script_args, conf=self.conf,
                                backend=self.backend)

    def add(self, command: Sequence[str] | None = None) -> AgentProcess:
        index = len(self.agents)
        agent = AgentProcess(command or self.command(), self.root / f"agent{index}.log", env=self.env)
        self.launched_at.append(time.time())
        agent.start()
        self.agents.append(agent)
        self.tails.append(self.tail_type(agent.log_path, index))
        return agent

    # --- reading ---

    def poll(self) -> None:
        for tail in self.tails:
            tail.poll()

    def steps(self) -> list[AgentStep]:
        self.poll()
        return sorted((AgentStep(t.agent, g, s) for t in self.tails for g, s in t.steps), key=lambda a: a.step.time)

    def failures(self) -> list[Failure]:
        self.poll()
        return [f for t in self.tails for f in t.failures]

    def round_keys(self) -> set[tuple[int, int, int]]:
        return {s.round_key for s in self.steps()}

    def first_new_round_step(
        self, after: float, world_size: int, known: set[tuple[int, int, int]], agents: set[int] | None = None
    ) -> AgentStep | None:
        """The first step after `after`, at `world_size`, of a worker generation not in `known`."""
        for s in self.steps():
            if s.step.time <= after or s.step.world_size != world_size or s.round_key in known:
                continue
            if agents is None or s.agent in agents:
                return s
        return None

    def steps_after(self, after: float, world_size: int) -> list[AgentStep]:
        return [s for s in self.steps() if s.step.time > after and s.step.world_size == world_size]

    def rank0_agent(self) -> int | None:
        """The agent whose worker printed the latest step (rank 0 prints the steps)."""
        steps = self.steps()
        return steps[-1].agent if steps else None

    def store_host(self) -> int | None:
        """The agent process listening on the c10d endpoint's port (it hosts the rendezvous TCPStore)."""
        if self.port is None:
            return None
        inodes = _listening_inodes(self.port)
        for index, agent in enumerate(self.agents):
            if agent.returncode is None and _owns_socket(agent.pid, inodes):
                return index
        return None

    def worker_pids(self) -> set[int]:
        return {pid for agent in self.agents if agent.returncode is None for pid in agent.worker_pids()}

    def wait_for(self, predicate: Callable[[], object], timeout: float) -> object:
        """Poll `predicate` every POLL s until truthy; returns its value (None on timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL)

    def wait_steady(self, world_size: int, after: float, count: int, timeout: float) -> bool:
        """At least `count` steps at `world_size` after `after` (training really runs in that round)."""
        return bool(self.wait_for(lambda: len(self.steps_after(after, world_size)) >= count, timeout))

    def tail_text(self, lines: int = 15) -> str:
        out = []
        for agent in self.agents:
            text = agent.output().splitlines()[-lines:]
            out.append(f"--- {agent.log_path}\n" + "\n".join(line[:240] for line in text))
        return "\n".join(out)

    def stop(self) -> None:
        for agent in self.agents:
            with contextlib.suppress(Exception):
                agent.stop()


def standalone_command(nproc: int, script_args: Sequence[str]) -> list[str]:
    """A single-node torchrun (`--standalone`), the floor's setting: no peer, no last call."""
    return [
        *common.TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", "--max-restarts=100",
        "--monitor-interval=0.2", str(EXAMPLE_SCRIPT), *script_args,
    ]


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if len(parts) > 9 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(parts[9])
    return inodes


def _owns_socket(pid: int, inodes: set[str]) -> bool:
    wanted = {f"socket:[{i}]" for i in inodes}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                return True
    return False
