"""The run's keys hang on one job lease that its agents keep alive (docs/design.md §3.2): by the TTL it was
granted with, whoever created the run, and when the keys are gone all the same, an agent says so instead of
failing on a missing record. Real handlers on a real etcd, in threads of this process; no workers."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from torch.distributed.elastic.rendezvous import RendezvousClosedError, RendezvousParameters

from elastic.rendezvous.plugin import create_handler
from elastic.rendezvous.run import JobRun
from elastic.store import JobKeys, Store
from harness.agents import wait_until

SHORT_TTL = 3  # seconds: the run's own TTL, far below the agents' default (an hour)


def _handler(url: str, run_id: str, nodes: int) -> Any:
    params = RendezvousParameters("etcd-v3", url, run_id, nodes, nodes, local_addr="127.0.0.1",
                                  job=f"default/{run_id}", lease_seconds=30, last_call_seconds=1)
    return create_handler(params)


def test_agents_keep_a_run_alive_by_the_ttl_it_was_created_with(any_etcd_server, store: Store) -> None:
    """A run created by someone else with a short TTL (the controller, a test, an agent configured otherwise)
    outlives that TTL while an agent holds it: the agent refreshes by the run's TTL, not by its own."""
    run_id = "short-ttl"
    state = JobRun(store, JobKeys("default", run_id)).ensure_run(run_id, 3, SHORT_TTL)
    handler = _handler(any_etcd_server.client_url, run_id, 1)
    try:
        assert handler.next_rendezvous().rank == 0
        until = time.monotonic() + 3 * SHORT_TTL
        while time.monotonic() < until:  # the property is survival for a span of time: watched all along it
            assert store.lease_ttl(state.job_lease) > 0, "the run's lease lapsed under its agent"
            time.sleep(0.2)
        assert store.get(JobKeys("default", run_id).round) is not None
    finally:
        handler.shutdown()


def test_an_agent_whose_run_vanished_says_so(any_etcd_server, store: Store) -> None:
    run_id = "vanished"
    waiting = _handler(any_etcd_server.client_url, run_id, 2)  # waits for a second member that never comes
    keys = JobKeys("default", run_id)
    with ThreadPoolExecutor(1) as pool:
        joining = pool.submit(waiting.next_rendezvous)
        assert wait_until(lambda: store.get(keys.member(waiting.member_id)) is not None, 30)
        store.revoke(store.get_json(keys.run)["lease"])  # every key of the run goes with it
        with pytest.raises(RendezvousClosedError, match="is gone from etcd"):
            joining.result(60)
    waiting.shutdown()
