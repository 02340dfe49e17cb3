"""Workers die with their agent (issue 22): torch starts each worker in a session of its own, so a SIGKILLed
agent used to leave it training unsupervised, writing the checkpoint directory the next agents resume from.
Real etcd, a real `elastic agent` (restart mode) and its real training processes."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from elastic.cluster.processes import is_running
from elastic.cluster.reaper import carries_token
from harness.agents import wait_until

pytestmark = pytest.mark.slow

ELASTIC_AGENT = (sys.executable, "-m", "elastic.agent")


def test_a_sigkilled_agent_takes_its_workers_along(training_job) -> None:
    job = training_job(nnodes="1:1", conf={"max_restarts": 3}, steps=100_000)
    agent = job.add_agent(launcher=ELASTIC_AGENT)
    assert wait_until(lambda: len(job.steps()) >= 3 and len(agent.worker_pids()) == 1, 120), job.logs()
    workers = agent.worker_pids()
    os.kill(agent.pid, signal.SIGKILL)  # the agent alone, as a node's OOM killer or a crash would
    assert wait_until(lambda: not any(is_running(pid) for pid in workers), 10), (
        f"workers {workers} outlived their agent: " + job.logs()
    )


def test_a_sigkilled_stock_torchrun_agent_takes_its_workers_along(training_job) -> None:
    """Stock `torchrun --rdzv-backend=etcd-v3` arms no parent-death signal: the backend's reaper, started by
    the agent's rendezvous handler, ends the workers (issue 44). Before it, they trained on for minutes."""
    job = training_job(nnodes="1:1", conf={"max_restarts": 3}, steps=100_000)
    agent = job.add_agent()  # python -m torch.distributed.run: torch's own launcher
    assert wait_until(lambda: len(job.steps()) >= 3 and len(agent.worker_pids()) == 1, 120), job.logs()
    workers = agent.worker_pids()
    os.kill(agent.pid, signal.SIGKILL)
    assert wait_until(lambda: not any(is_running(pid) for pid in workers), 10), (
        f"workers {workers} outlived their agent: " + job.logs()
    )


@pytest.mark.parametrize(
    ("block", "found"),
    [
        pytest.param(b"A=1\0ELASTIC_REAP_TOKEN=7-abc\0B=2\0", True, id="a worker of this agent is ended"),
        pytest.param(b"ELASTIC_REAP_TOKEN=7-abcd\0", False, id="another agent's token is not this one"),
        pytest.param(b"X_ELASTIC_REAP_TOKEN=7-abc\0", False, id="a variable that only ends with the name is not it"),
        pytest.param(b"", False, id="a process whose environment cannot be read is left alone"),
    ],
)
def test_whom_the_reaper_ends(block: bytes, found: bool) -> None:
    assert carries_token(block, "7-abc") is found


def test_a_stopped_worker_of_a_stock_script_is_ended_by_its_agent_and_charged_once(training_job, monkeypatch) -> None:
    """A stock script tells nothing of its steps: a worker that cannot run (SIGSTOP) for the hang floor is
    frozen; its agent ends it (exit 87, charged once) and the job trains on (issue 22)."""
    monkeypatch.setenv("ELASTIC_HANG_FLOOR_SECONDS", "3")  # the agents inherit it
    job = training_job(nnodes="2:2", conf={"max_restarts": 3}, steps=100_000)
    agents = [job.add_agent(launcher=ELASTIC_AGENT) for _ in range(2)]
    assert wait_until(lambda: len(job.steps()) >= 5 and all(a.worker_pids() for a in agents), 120), job.logs()
    (stopped,) = agents[1].worker_pids()
    os.kill(stopped, signal.SIGSTOP)
    stopped_at = time.time()
    assert wait_until(lambda: job.budget()["used"] == 1, 60), job.logs()
    assert wait_until(lambda: len(job.steps_since(stopped_at + 3)) >= 3, 90), "training goes on: " + job.logs()
    (charge,) = job.budget()["charges"]
    assert charge["exit_code"] == 87 and "could not run (process state T)" in charge["cause"], charge
