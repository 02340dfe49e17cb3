"""An etcd outage is not a node failure (docs/design.md §3.11): real torchrun agents, a real etcd stopped by SIGSTOP.

Each test gets its own etcd (the module overrides the session's), since stopping it would stall others.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from elastic.store.server import EtcdServer
from harness.agents import wait_until

pytestmark = pytest.mark.slow
STARTUP = 90


@pytest.fixture
def etcd_server(stoppable_etcd_server: EtcdServer) -> EtcdServer:
    """This module stops its etcd: each test gets one of its own."""
    return stoppable_etcd_server


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


def _members(job) -> list[str]:
    return [e.key for e in job.store.get_prefix(job.keys.members_prefix)[0]]


def _kill_all_at_once(agents) -> None:
    """Freeze every process of every agent first, so that no agent sees another die and ends the round."""
    for agent in agents:
        for pid in [agent.pid, *agent.worker_pids()]:
            os.kill(pid, signal.SIGSTOP)
    for agent in agents:
        agent.kill()


def _ended_the_dead_round(job) -> bool:
    return any("has no live member left" in agent.output() for agent in job.agents)


def test_a_dead_round_is_ended_by_fresh_agents_and_charged_once(training_job) -> None:
    """The whole job SIGKILLed: nobody of the sealed round is left to end it, so the next agents do."""
    job = training_job(conf={"max_restarts": 3, "lease_seconds": 3}, steps=100000)
    first = [job.add_agent(), job.add_agent()]
    assert wait_until(lambda: len(job.steps()) >= 5, STARTUP), job.logs()
    dead_round = job.round()["round"]
    _kill_all_at_once(first)
    assert wait_until(lambda: not _members(job), 30), "the killed agents' leases never ran out"
    restarted_at = time.time()
    job.add_agent(), job.add_agent()
    # far below join_timeout (900 s): nobody waits on the dead round
    assert wait_until(lambda: any(s.world_size == 2 for s in job.steps_since(restarted_at)), STARTUP), job.logs()
    assert job.round()["round"] > dead_round and _ended_the_dead_round(job), job.logs()
    charges = job.budget()["charges"]
    assert [(c["round"], c["reason"]) for c in charges] == [(dead_round, "MemberLost")], charges
    assert job.closed() is None


def test_a_dead_round_left_by_an_etcd_outage_is_ended_for_free(training_job, etcd_server) -> None:
    """Every agent died while etcd was away; a new agent that lived through the outage ends the round free."""
    job = training_job(conf={"max_restarts": 0, "lease_seconds": 3}, steps=100000)
    first = [job.add_agent(), job.add_agent()]
    assert wait_until(lambda: len(job.steps()) >= 5, STARTUP), job.logs()
    dead_round = job.round()["round"]
    assert etcd_server.process is not None
    os.kill(etcd_server.process.pid, signal.SIGSTOP)
    try:
        _kill_all_at_once(first)
        newcomer = job.add_agent()
        # the outage is what the test is about: the newcomer's first calls must meet etcd away
        assert wait_until(lambda: "etcd unavailable" in newcomer.output(), 60), newcomer.output()[-2000:]
    finally:
        os.kill(etcd_server.process.pid, signal.SIGCONT)
    resumed = time.time()
    job.add_agent()
    assert wait_until(lambda: any(s.world_size == 2 for s in job.steps_since(resumed)), STARTUP), job.logs()
    assert job.round()["round"] > dead_round and _ended_the_dead_round(job), job.logs()
    assert job.budget()["used"] == 0, job.budget()
    assert job.closed() is None, "maxRestarts 0: one charge would have closed the job"


def test_a_handler_left_at_exit_with_etcd_gone_does_not_hang(etcd_server) -> None:
    """torch's harnesses end a process with handlers never shut down, often after stopping etcd: the at-exit
    leave gives etcd a short while, not the 15 s per handler of a rendezvous call."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    from elastic.rendezvous.handler import AT_EXIT_RETRY_SECONDS
    from elastic.rendezvous.plugin import create_handler

    params = RendezvousParameters("etcd-v3", etcd_server.client_url, "at-exit", 1, 1, local_addr="127.0.0.1")
    handler = create_handler(params)
    handler.next_rendezvous()
    assert etcd_server.process is not None
    etcd_server.process.kill()
    etcd_server.process.wait()
    started = time.monotonic()
    handler._at_exit()  # what atexit runs
    assert time.monotonic() - started < 3 * AT_EXIT_RETRY_SECONDS + 2, "waited for etcd as if it could come back"
