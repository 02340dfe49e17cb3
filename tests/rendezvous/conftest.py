"""Real torchrun agents on a real etcd: the arrangement every rendezvous story test starts from."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elastic.store import JobKeys, Store
from elastic.store.server import EtcdServer
from harness.agents import AgentProcess, Step, round_record, torchrun_command


class TrainingJob:
    """One run id: its agents (torchrun processes), its checkpoint dir, and its keys in etcd."""

    def __init__(self, etcd: EtcdServer, root: Path, run_id: str, nnodes: str, conf: dict[str, Any],
                 steps: int, extra_args: list[str]) -> None:
        self.etcd = etcd
        self.root = root
        self.run_id = run_id
        self.nnodes = nnodes
        self.conf = {"lease_seconds": 3, "last_call_seconds": 1, **conf}
        self.script_args = [
            "--steps", str(steps), "--step-seconds", "0.05", "--checkpoint-every", "5",
            "--checkpoint-dir", str(root / "checkpoints"), *extra_args,
        ]
        self.agents: list[AgentProcess] = []
        self.store = Store(etcd.client_url)
        self.keys = JobKeys.parse(str(self.conf.get("job", f"default/{run_id}")))

    def add_agent(self, launcher: tuple[str, ...] | None = None, **overrides: Any) -> AgentProcess:
        """Start one agent: stock torchrun, or `launcher` (e.g. `elastic agent`) with the same arguments."""
        command = torchrun_command(self.etcd.client_url, self.run_id, self.nnodes, self.script_args,
                                   conf={**self.conf, **overrides},
                                   **({"launcher": launcher} if launcher else {}))
        agent = AgentProcess(command, self.root / f"agent{len(self.agents)}.log").start()
        self.agents.append(agent)
        return agent

    def steps(self) -> list[Step]:
        """Every step line of every agent (rank 0 prints them, wherever rank 0 lives), by time."""
        return sorted((s for a in self.agents for s in a.steps()), key=lambda s: s.time)

    def steps_since(self, t: float) -> list[Step]:
        return [s for s in self.steps() if s.time > t]

    def budget(self) -> dict[str, Any]:
        return self.store.get_json(self.keys.budget)

    def round(self) -> dict[str, Any]:
        return round_record(self.store, self.keys)

    def closed(self) -> dict[str, Any] | None:
        return self.store.get_json(self.keys.closed)

    def logs(self) -> str:
        return "\n".join(f"--- {a.log_path.name}\n{a.output()[-3000:]}" for a in self.agents)

    def stop(self) -> None:
        for agent in self.agents:
            agent.stop()
        self.store.close()


@pytest.fixture
def training_job(etcd_server: EtcdServer, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    made: list[TrainingJob] = []

    def make(nnodes: str = "1:2", conf: dict[str, Any] | None = None, steps: int = 400,
             extra_args: list[str] | None = None, run_id: str | None = None) -> TrainingJob:
        name = run_id or f"{request.node.name.replace('_', '-')[:40]}-{len(made)}"
        job = TrainingJob(etcd_server, tmp_path / name, name, nnodes, conf or {}, steps, extra_args or [])
        job.root.mkdir(parents=True, exist_ok=True)
        made.append(job)
        return job

    yield make
    for job in made:
        job.stop()
