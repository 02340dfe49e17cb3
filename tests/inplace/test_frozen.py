"""A frozen worker costs one charge and a bounded delay, never a stall (issue 22): a worker that cannot run
(SIGSTOP here; uninterruptible sleep alike) cannot run its own watchdog either, so its agent reads its
heartbeat and ends it once it is past its step deadline. Real etcd, real in-place agents, gloo."""

from __future__ import annotations

import os
import signal
import time

import pytest
from test_inplace_recovery import in_place_job, worker_pid  # noqa: F401 (the fixture)

from harness.agents import wait_until

pytestmark = pytest.mark.slow


def test_a_stopped_worker_is_ended_by_its_agent_and_charged_once(in_place_job) -> None:  # noqa: F811
    total = 300
    job = in_place_job("2:2", ["--steps", str(total), "--step-seconds", "0.03"],
                       env={"ELASTIC_HANG_FLOOR_SECONDS": "2"})  # fmt: skip
    agents = [job.add_agent() for _ in range(2)]
    assert wait_until(lambda: any(s > 30 for s in job.steps()), 120), job.logs()
    frozen = worker_pid(agents[1])
    os.kill(frozen, signal.SIGSTOP)
    stopped_at = time.time()
    try:
        assert wait_until(lambda: any(s.time > stopped_at + 2 for a in agents for s in a.steps()), 30), (
            "training goes on past the frozen worker: " + job.logs()
        )
    finally:
        if frozen in agents[1].worker_pids():
            os.kill(frozen, signal.SIGCONT)
    job.wait_finished(180)
    budget = job.budget()
    assert budget["used"] == 1 and budget["charges"][0]["exit_code"] == 87, budget
    assert "could not run (process state T)" in budget["charges"][0]["cause"], budget
