"""An etcd outage is not a node failure (DESIGN §3.11): real torchrun agents, a real etcd stopped by SIGSTOP.

Each test gets its own etcd (the module overrides the session's), since stopping it would stall others.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from elastic.agents import wait_until
from elastic.store.server import EtcdServer

pytestmark = pytest.mark.slow
STARTUP = 90


@pytest.fixture
def etcd_server() -> Iterator[EtcdServer]:
    server = EtcdServer().start()
    yield server
    if server.process is not None and server.process.poll() is None:
        os.kill(server.process.pid, signal.SIGCONT)
    server.remove()


def _pause(etcd: EtcdServer, seconds: float) -> float:
    assert etcd.process is not None
    os.kill(etcd.process.pid, signal.SIGSTOP)
    time.sleep(seconds)  # the outage itself: its length is what the test is about
    os.kill(etcd.process.pid, signal.SIGCONT)
    return time.time()


def test_outage_shorter_than_the_lease_changes_nothing(training_job, etcd_server) -> None:
    job = training_job(conf={"max_restarts": 0, "lease_seconds": 10}, steps=100000)
    job.add_agent(), job.add_agent()
    assert wait_until(lambda: len(job.steps()) >= 5, STARTUP), job.logs()
    round_before = job.round()["round"]
    resumed = _pause(etcd_server, 2)
    assert wait_until(lambda: len(job.steps_since(resumed)) >= 5, 30), job.logs()
    assert job.round()["round"] == round_before, "no round change for a short outage"
    assert job.budget()["used"] == 0 and job.closed() is None


def test_outage_longer_than_the_lease_is_free_and_a_real_loss_still_charges(training_job, etcd_server) -> None:
    job = training_job(conf={"max_restarts": 1, "lease_seconds": 3}, steps=100000)
    agents = [job.add_agent(), job.add_agent()]
    assert wait_until(lambda: len(job.steps()) >= 5, STARTUP), job.logs()
    resumed = _pause(etcd_server, 8)
    assert wait_until(lambda: any(s.world_size == 2 for s in job.steps_since(resumed + 1)), 90), job.logs()
    assert job.closed() is None, job.closed()
    assert job.budget()["used"] == 0, job.budget()
    killed_at = time.time()
    agents[1].kill()
    assert wait_until(lambda: any(s.world_size == 1 for s in job.steps_since(killed_at)), 60), job.logs()
    assert job.budget()["used"] == 1, job.budget()
