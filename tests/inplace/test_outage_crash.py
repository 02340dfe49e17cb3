"""A crash during an etcd outage is still charged (issue 22): the outage is free, the crash is not
(docs/design.md §3.11). Its agent keeps the failure it could not report and charges it once etcd is back,
naming the worker and its exit code. Real etcd (this test's own: it is stopped), real in-place agents, gloo."""

from __future__ import annotations

import os
import signal
import time

import pytest
from test_inplace_recovery import in_place_job, worker_pid  # noqa: F401 (the fixture)

from elastic.store.server import EtcdServer
from harness.agents import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def etcd_server(stoppable_etcd_server: EtcdServer) -> EtcdServer:
    """This module stops its etcd: each test gets one of its own."""
    return stoppable_etcd_server


def test_a_worker_killed_while_etcd_is_away_is_charged_once_etcd_is_back(in_place_job, etcd_server) -> None:  # noqa: F811
    total = 300
    job = in_place_job("2:2", ["--steps", str(total), "--step-seconds", "0.03"], conf={"lease_seconds": 4})
    agents = [job.add_agent() for _ in range(2)]
    assert wait_until(lambda: any(s > 30 for s in job.steps()), 120), job.logs()
    crashed = worker_pid(agents[1])
    assert etcd_server.process is not None
    os.kill(etcd_server.process.pid, signal.SIGSTOP)
    try:
        os.kill(crashed, signal.SIGKILL)  # the crash, while no report can reach etcd
        time.sleep(6)  # the outage itself, longer than the 4 s lease: its length is what the test is about
    finally:
        os.kill(etcd_server.process.pid, signal.SIGCONT)
    job.wait_finished(180)
    budget = job.budget()
    assert budget["used"] == 1, (budget, job.logs())
    (charge,) = budget["charges"]
    assert charge["exit_code"] == 137, (charge, job.logs())
    assert charge["member"] and f"-{agents[1].pid}-" in charge["member"], charge


OUTAGE_SECONDS = 45  # 3 x the longest retry bound of an agent's or a session's etcd calls (15 s)


def test_a_long_outage_is_a_wait_for_agents_and_sessions_and_costs_nothing(in_place_job, etcd_server) -> None:  # noqa: F811
    """No process dies of an etcd outage (issue 41): the agents fence their workers once their leases lapse,
    every agent and session waits for etcd however long it is away, and the job trains on when it is back."""
    total = 400
    job = in_place_job("2:2", ["--steps", str(total), "--step-seconds", "0.03"], conf={"lease_seconds": 4})
    agents = [job.add_agent() for _ in range(2)]
    assert wait_until(lambda: any(s > 30 for s in job.steps()), 120), job.logs()
    assert etcd_server.process is not None
    os.kill(etcd_server.process.pid, signal.SIGSTOP)
    try:
        time.sleep(OUTAGE_SECONDS)  # the outage itself: its length is what the test is about
        exited = [a.log_path.name for a in agents if a.returncode is not None]
        assert not exited, f"{exited} exited during the outage: {job.logs()}"
    finally:
        os.kill(etcd_server.process.pid, signal.SIGCONT)
    job.wait_finished(240)
    assert job.budget()["used"] == 0, (job.budget(), job.logs())
    assert {step for step, *_ in job.done()} == {total}, job.logs()
