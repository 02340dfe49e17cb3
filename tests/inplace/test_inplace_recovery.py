"""In-place recovery with real processes: real etcd, real `elastic agent --recovery=in-place` agents, gloo.

What must hold after each incident: the survivors' worker processes are the same (pids unchanged), a
replacement or newcomer ends with the survivors' parameters (equal checksums), no committed step is lost
or applied twice (every step number is printed once, and `applied` equals the step count on every rank),
and the budget is charged once per incident (a scale-up not at all).
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from elastic.store import JobKeys, Store
from elastic.store.server import EtcdServer
from harness.agents import AgentProcess, torchrun_command, wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
IN_PLACE = (sys.executable, "-m", "elastic.agent", "--recovery=in-place")
DONE = re.compile(r"^done step=(\d+) applied=(\d+) checksum=(\S+) pid=(\d+)$", re.M)
RECOVERED = re.compile(r"^recovered round=(\d+) rank=(\d+) world_size=(\d+) .* bytes=(\d+) source=(\d+)", re.M)


class InPlaceJob:
    def __init__(self, etcd: EtcdServer, root: Path, run_id: str, nnodes: str, script_args: list[str],
                 script: Path = ROOT / "examples" / "train_inplace.py", env: dict[str, str] | None = None,
                 nproc_per_node: int = 1, conf: dict[str, Any] | None = None) -> None:
        self.etcd, self.root, self.run_id, self.nnodes = etcd, root, run_id, nnodes
        self.nproc_per_node = nproc_per_node
        self.conf = {"lease_seconds": 3, "last_call_seconds": 1, "max_restarts": 5, **(conf or {})}
        self.script, self.script_args, self.env = script, script_args, env or {}
        self.agents: list[AgentProcess] = []
        self.store = Store(etcd.client_url)
        self.keys = JobKeys.parse(f"default/{run_id}")

    def add_agent(self) -> AgentProcess:
        command = torchrun_command(self.etcd.client_url, self.run_id, self.nnodes, self.script_args,
                                   conf=self.conf,
                                   launcher=IN_PLACE, script=self.script, nproc_per_node=self.nproc_per_node)
        agent = AgentProcess(command, self.root / f"agent{len(self.agents)}.log", env=self.env).start()
        self.agents.append(agent)
        return agent

    def output(self) -> str:
        return "\n".join(a.output() for a in self.agents)

    def steps(self) -> list[int]:
        return [s.step for s in sorted((s for a in self.agents for s in a.steps()), key=lambda s: s.time)]

    def done(self) -> list[tuple[int, int, str, int]]:
        return [(int(m[1]), int(m[2]), m[3], int(m[4])) for m in DONE.finditer(self.output())]

    def budget(self) -> dict[str, Any]:
        return self.store.get_json(self.keys.budget)

    def wait_finished(self, timeout: float = 120) -> None:
        assert wait_until(lambda: all(a.returncode is not None for a in self.agents), timeout), self.logs()
        assert [a.returncode for a in self.agents] == [0] * len(self.agents), self.logs()

    def logs(self) -> str:
        return "\n".join(f"--- {a.log_path.name}\n{a.output()[-4000:]}" for a in self.agents)

    def stop(self) -> None:
        for agent in self.agents:
            agent.stop()
        self.store.close()


@pytest.fixture
def in_place_job(etcd_server: EtcdServer, tmp_path: Path, request: pytest.FixtureRequest):
    made: list[InPlaceJob] = []

    def make(nnodes: str, script_args: list[str], **kwargs: Any) -> InPlaceJob:
        full = request.node.name.replace("_", "-").replace("[", "-").replace("]", "")
        # A run id is at most 40 characters: a longer name keeps a digest of the rest (parametrized cases differ
        # only at their end, and each must be a run of its own).
        name = full if len(full) <= 40 else f"{full[:33].strip('-')}-{hashlib.sha1(full.encode()).hexdigest()[:6]}"
        root = tmp_path
        if made:  # a test's second job is a run of its own, with its own logs
            name = f"{name[:36]}-{len(made)}"
            root = tmp_path / name
            root.mkdir()
        job = InPlaceJob(etcd_server, root, name, nnodes, script_args, **kwargs)
        made.append(job)
        return job

    yield make
    for job in made:
        job.stop()


def assert_consistent(job: InPlaceJob, total: int, ranks: int, printer_killed: bool = False) -> None:
    """Every step committed once, in order; every rank ends with the same state, `applied` == steps.

    `printer_killed`: rank 0 (which prints the step lines) was SIGKILLed, possibly between committing a step
    and printing it; that one line may be missing, never repeated. `applied` still counts every step."""
    steps = job.steps()
    if printer_killed:
        assert steps == sorted(set(steps)) and len(steps) >= total - 1 and steps[-1] == total - 1, job.logs()
    else:
        assert steps == list(range(total)), job.logs()
    done = job.done()
    assert len(done) == ranks, job.logs()
    assert {(step, applied) for step, applied, _, _ in done} == {(total, total)}, job.logs()
    assert len({checksum for _, _, checksum, _ in done}) == 1, job.logs()


def worker_pid(agent: AgentProcess) -> int:
    assert wait_until(lambda: len(agent.worker_pids()) == 1, 60), agent.output()
    return agent.worker_pids()[0]


@pytest.mark.parametrize("reduction", [[], ["--ddp"]], ids=["session-allreduce", "ddp-module"])
def test_a_worker_crash_keeps_the_survivors_and_hands_state_to_the_replacement(
    in_place_job, tmp_path, reduction: list[str]
) -> None:
    """Whether the script averages through the session or builds a DDP module on its group (issue 45)."""
    total = 120
    job = in_place_job("2:3", [*reduction, "--steps", str(total), "--step-seconds", "0.02", "--crash-at-step", "60",
                               "--crash-marker", str(tmp_path / "crashed")])
    agents = [job.add_agent() for _ in range(2)]
    assert wait_until(lambda: len(job.steps()) > 5, 90), job.logs()
    before = [worker_pid(a) for a in agents]
    job.wait_finished()

    assert_consistent(job, total, ranks=2)
    survivors = {pid for *_, pid in job.done()} & set(before)
    assert len(survivors) == 1, f"exactly the crashed worker was replaced: {before} -> {job.done()}"
    replacement = [m for m in RECOVERED.finditer(job.output()) if int(m[1]) > 0 and int(m[4]) > 0]
    assert replacement, "the replacement received the state from a live peer"
    budget = job.budget()
    assert budget["used"] == 1 and [c["reason"] for c in budget["charges"]] == ["WorkerFailure"], budget


def test_rank_0_killed_among_two_workers_per_node_gets_the_state_from_rank_1(in_place_job) -> None:
    """SIGKILL of global rank 0 (2 agents x 2 workers): the lowest survivor that holds the state sends it, the
    replacement takes rank 0 again (its agent keeps its rank in the next round), one charge."""
    total = 150
    job = in_place_job("2:2", ["--steps", str(total), "--step-seconds", "0.03"], nproc_per_node=2)
    agents = [job.add_agent() for _ in range(2)]
    assert wait_until(lambda: any(s > 20 for s in job.steps()), 90), job.logs()
    assert wait_until(lambda: all(len(a.worker_pids()) == 2 for a in agents), 30), job.logs()
    host = next(a for a in agents if re.search(r"^recovered round=0 rank=0 ", a.output(), re.M))
    rank0 = int(re.search(r"^recovered round=0 rank=0 .* pid=(\d+)", host.output(), re.M)[1])
    before = {pid for a in agents for pid in a.worker_pids()}
    os.kill(rank0, signal.SIGKILL)
    job.wait_finished()

    assert_consistent(job, total, ranks=4, printer_killed=True)
    kept = {pid for *_, pid in job.done()} & before
    assert kept and rank0 not in kept, "survivors keep their processes"
    # A survivor whose collective waited on a peer that left it (not on the dead one: gloo's ring) gives it up
    # once the round ended and is re-forked for free (exit 86); nobody else was replaced.
    abandoned = len(re.findall(r"exits \(86\)", job.output()))
    assert len(kept) + abandoned == 3, job.logs()
    received = [m for m in RECOVERED.finditer(host.output()) if int(m[1]) > 0 and int(m[2]) == 0]
    assert received and int(received[0][4]) > 0 and int(received[0][5]) != 0, host.output()[-3000:]
    budget = job.budget()
    assert budget["used"] == 1 and budget["charges"][0]["exit_code"] == 137, budget  # SIGKILL, as a shell says


def test_a_lost_node_is_survived_in_place_and_charged_once(in_place_job) -> None:
    """The survivors' broken groups say a peer vanished; nobody reports it, so their agents end the round
    (MemberLost, once) long before the lost member's 60 s lease would."""
    total = 200
    job = in_place_job("2:3", ["--steps", str(total), "--step-seconds", "0.03"], conf={"lease_seconds": 60})
    agents = [job.add_agent() for _ in range(3)]
    assert wait_until(lambda: any(s > 20 for s in job.steps()) and "world_size=3" in job.output(), 90), job.logs()
    before = {a.pid: worker_pid(a) for a in agents}
    rank0 = [a for a in agents if re_rank(a) == 0]
    victim = next(a for a in agents if a not in rank0)
    victim.kill()
    killed_at = time.time()
    survivors = [a for a in agents if a is not victim]
    assert wait_until(lambda: any(s.world_size == 2 and s.time > killed_at for a in survivors for s in a.steps()),
                      30), "trained again at world size 2 well within the lease: " + job.logs()
    assert wait_until(lambda: all(a.returncode is not None for a in survivors), 120), job.logs()
    assert [a.returncode for a in survivors] == [0, 0], job.logs()

    done = job.done()
    assert {pid for *_, pid in done} == {before[a.pid] for a in survivors}, "survivors kept their processes"
    assert {(s, applied) for s, applied, _, _ in done} == {(total, total)} and len({c for _, _, c, _ in done}) == 1
    steps = job.steps()
    assert steps == sorted(set(steps)) and steps[-1] == total - 1, "no step printed twice or out of order"
    budget = job.budget()
    assert budget["used"] == 1 and [c["reason"] for c in budget["charges"]] == ["MemberLost"], budget


def re_rank(agent: AgentProcess) -> int | None:
    found = RECOVERED.search(agent.output())
    return int(found[2]) if found else None


def test_a_scale_up_is_free_and_the_newcomer_receives_the_state(in_place_job) -> None:
    # Enough steps left for the newcomer's agent to start (torch imported, zygote ready) on a loaded machine:
    # at 200 the first two could finish before it arrived, and it then joined a round nobody trained in.
    total = 400
    job = in_place_job("2:3", ["--steps", str(total), "--step-seconds", "0.03"])
    first = [job.add_agent() for _ in range(2)]
    assert wait_until(lambda: any(s > 20 for s in job.steps()), 90), job.logs()
    before = [worker_pid(a) for a in first]
    newcomer = job.add_agent()
    job.wait_finished()

    assert_consistent(job, total, ranks=3)
    assert set(before) <= {pid for *_, pid in job.done()}, "the first two workers kept their processes"
    joined = [m for m in RECOVERED.finditer(newcomer.output()) if int(m[3]) == 3]
    assert joined and int(joined[0][4]) > 0, newcomer.output()
    assert job.budget()["used"] == 0


def test_a_hung_worker_is_found_by_its_step_deadline_and_replaced(in_place_job, tmp_path) -> None:
    job = in_place_job("2:2", ["60", "30", str(tmp_path / "hung")], script=Path(__file__).parent / "hang_worker.py",
                       env={"ELASTIC_HANG_FLOOR_SECONDS": "2"})
    for _ in range(2):
        job.add_agent()
    job.wait_finished()

    assert "exits (87): step 30 made no progress" in job.output(), job.logs()
    assert len(re.findall(r"^done step=60 ", job.output(), re.M)) == 2, job.logs()
    budget = job.budget()
    assert budget["used"] == 1 and budget["charges"][0]["exit_code"] == 87, budget


def test_a_stock_script_is_restarted_whole_from_the_warm_zygote(in_place_job, tmp_path) -> None:
    job = in_place_job("2:2", ["--steps", "40", "--step-seconds", "0.02", "--checkpoint-every", "5",
                               "--checkpoint-dir", str(tmp_path / "ckpt"), "--crash-at-step", "20",
                               "--crash-once-marker", "crashed"],
                       script=ROOT / "examples" / "train_ddp.py")
    for _ in range(2):
        job.add_agent()
    job.wait_finished()

    assert "done step=40" in job.output(), job.logs()
    assert job.budget()["used"] == 1
