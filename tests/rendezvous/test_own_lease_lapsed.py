"""A crash while etcd is away, where one member's lease lapsed and the other's held: whichever member's lease
lapsed, the charge names the crashed worker and its exit code (issue 22, docs/design.md §3.11).

Deterministic forms of the races the outage test (tests/inplace/test_outage_crash.py) hits under load: the
lease is revoked by the test instead of lapsing in a paused etcd, so the member ending the round finds its
own key gone. Two real handlers on a real etcd (both versions here), in threads of this process, driven as
the in-place agent drives them; no workers.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters

from elastic.errors import LeaseLostError
from elastic.rendezvous.plugin import create_handler
from elastic.store.client import Store
from elastic.store.keys import JobKeys
from harness.agents import wait_until


def _handler(url: str, run_id: str) -> Any:
    params = RendezvousParameters("etcd-v3", url, run_id, 2, 2, local_addr="127.0.0.1",
                                  job=f"default/{run_id}", lease_seconds=30, settle_seconds=3, max_restarts=3)
    return create_handler(params)


@pytest.mark.parametrize("lapsed", ["crashed", "peer"], ids=lambda who: f"the {who}'s lease lapsed")
def test_a_crash_while_a_lease_lapsed_is_charged_with_its_exit_code(any_etcd_server, store: Store,
                                                                      lapsed: str) -> None:
    run_id = f"lapse-{lapsed}-{any_etcd_server.client_url.rsplit(':', 1)[1]}"
    crashed, peer = _handler(any_etcd_server.client_url, run_id), _handler(any_etcd_server.client_url, run_id)
    keys = JobKeys("default", run_id)
    with ThreadPoolExecutor(2) as pool:
        assert {f.result(60).rank for f in [pool.submit(h.next_rendezvous) for h in (crashed, peer)]} == {0, 1}
        round_before = store.get_json(keys.round)["round"]

        crashed.report_worker_failure(137)  # its worker was SIGKILLed while etcd was away: nothing reached etcd
        first, second = (crashed, peer) if lapsed == "crashed" else (peer, crashed)
        if first is peer:
            peer.report_lost_peer()  # its workers' group broke with the crashed worker
        store.revoke(first._member_lease.lease_id)  # its lease lapsed in the outage; the other's held
        assert wait_until(lambda: first._member_lease.lost.is_set(), 30)

        first_again = pool.submit(first.next_rendezvous)  # the first back ends the round
        assert wait_until(lambda: store.get_json(keys.round)["round"] > round_before, 30), "the round never ended"
        second_again = pool.submit(second.next_rendezvous)
        first_again.result(60), second_again.result(60)
    budget = store.get_json(keys.budget)
    assert budget["used"] == 1, budget
    (charge,) = budget["charges"]
    assert charge["reason"] == "WorkerFailure" and charge["exit_code"] == 137, charge
    assert charge["member"] == crashed.member_id, charge
    for handler in (crashed, peer):
        handler.shutdown()


def test_a_member_whose_lease_lapsed_while_it_waited_in_an_open_round_writes_its_key_again(any_etcd_server,
                                                                                          store: Store) -> None:
    """A member that is not the sealer keeps its own key as it wrote it (it does not watch it): when its lease
    lapses while the round is still gathering, the key is gone, and the member must write it again under its new
    lease, or the sealer never sees it (docs/design.md §3.20)."""
    url = any_etcd_server.client_url
    run_id = f"rewrite-{url.rsplit(':', 1)[1]}"
    params = dict(local_addr="127.0.0.1", job=f"default/{run_id}", lease_seconds=30, last_call_seconds=60,
                  join_timeout=60)  # a member that never writes its key again fails the test in a minute
    handlers = [create_handler(RendezvousParameters("etcd-v3", url, run_id, 3, 3, **params)) for _ in range(3)]
    keys = JobKeys("default", run_id)
    with ThreadPoolExecutor(3) as pool:
        first = [pool.submit(h.next_rendezvous) for h in handlers[:2]]
        assert wait_until(lambda: len(store.get_prefix(keys.members_prefix)[0]) == 2, 30)
        follower = next(h for h in handlers[:2] if not h._view.whole)
        store.revoke(follower._member_lease.lease_id)  # its key goes with it; it waits on in the open round
        assert wait_until(lambda: store.get(keys.member(follower.member_id)) is not None, 30), \
            "the member never wrote its key again under its new lease"
        last = pool.submit(handlers[2].next_rendezvous)
        assert sorted(f.result(60).rank for f in [*first, last]) == [0, 1, 2]
    for handler in handlers:
        handler.shutdown()


def test_a_member_whose_lease_etcd_dropped_joins_again_under_a_new_one_at_once(any_etcd_server, store: Store) -> None:
    """An overloaded etcd may expire a member's lease before the member's keeper hears of it (its next keep-alive
    is a third of the TTL away). The member that then writes its key is refused ("lease not found"), and would
    be refused again and again until the keeper noticed: it takes a new lease at the first refusal."""
    url = any_etcd_server.client_url
    run_id = f"dropped-{url.rsplit(':', 1)[1]}"
    params = dict(local_addr="127.0.0.1", job=f"default/{run_id}", lease_seconds=30, last_call_seconds=60,
                  join_timeout=60)  # keep-alives every ~10 s: the keeper does not notice within the test
    handlers = [create_handler(RendezvousParameters("etcd-v3", url, run_id, 3, 3, **params)) for _ in range(3)]
    keys = JobKeys("default", run_id)
    with ThreadPoolExecutor(3) as pool:
        first = [pool.submit(h.next_rendezvous) for h in handlers[:2]]
        assert wait_until(lambda: len(store.get_prefix(keys.members_prefix)[0]) == 2, 30)
        sealer = next(h for h in handlers[:2] if h._view.whole)  # it watches its own key: it writes it again
        refused: list[str] = []
        put_member = sealer.run.put_member

        def counted(*args: Any, **kwargs: Any) -> int:
            try:
                return put_member(*args, **kwargs)
            except LeaseLostError as err:
                refused.append(str(err))
                raise

        sealer.run.put_member = counted
        dropped = sealer._member_lease.lease_id
        store.revoke(dropped)
        assert wait_until(lambda: (entry := store.get(keys.member(sealer.member_id))) is not None
                          and entry.lease != dropped, 30), "the member never wrote its key under a new lease"
        assert len(refused) <= 1, f"{len(refused)} writes under the dropped lease"
        last = pool.submit(handlers[2].next_rendezvous)
        assert sorted(f.result(60).rank for f in [*first, last]) == [0, 1, 2]
    for handler in handlers:
        handler.shutdown()
