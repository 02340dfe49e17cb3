"""Workers die with their agent (issue 22): torch starts each worker in a session of its own, so a SIGKILLed
agent used to leave it training unsupervised, writing the checkpoint directory the next agents resume from.
Real etcd, a real `elastic agent` (restart mode) and its real training processes."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from elastic.cluster.processes import is_running
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
