"""What one member sends to and receives from etcd to be ranked does not grow with the job (issue 27,
docs/design.md §3.20): a member that is not the sealer watches no other member's key and reads only its own
bucket of the ranks, so its requests and watch events are the same at 64 members as at 8, and the bytes it
receives stay below one bucket's worth. Real handlers on a real etcd, as threads of this process (each with
its own etcd connection and lease); the store counts every request its handler makes and the bytes of the
answers; the view counts the watch events it received."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousParameters

from elastic.rendezvous.config import RendezvousConfig
from elastic.rendezvous.handler import EtcdV3RendezvousHandler
from elastic.rendezvous.run import JobRun
from elastic.store import JobKeys, Store
from harness.agents import wait_until


class CountingStore(Store):
    """A real etcd client that counts its unary requests and the bytes of their answers: the rendezvous's, not
    the agent store's (rank 0 writes the workers' MASTER_ADDR and MASTER_PORT there, whoever seals)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests = 0
        self.bytes_received = 0
        self.calls: Counter[str] = Counter()  # by kind, to say which request a failure counted more of

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        result = super()._call(what, fn, *args, **kwargs)
        if "/store/" in what:
            return result
        self.requests += 1
        self.calls[what] += 1
        size = getattr(result, "ByteSize", None)
        self.bytes_received += size() if callable(size) else 0
        return result


def _round_cost(url: str, n: int) -> list[tuple[int, int, int, Counter[str]]]:
    """(requests, bytes received, watch events) of each member but the sealer, for one round of n members."""
    params = RendezvousParameters("etcd-v3", url, f"cost-{n}", n, n, local_addr="127.0.0.1", job=f"default/cost-{n}",
                                  lease_seconds=30, last_call_seconds=30)
    # The run exists before its members come, so that what is counted is the round, not N members racing to
    # create the run (each loser reads it again: a count that depends on timing, not on N).
    JobRun(Store(url), JobKeys("default", f"cost-{n}")).ensure_run(f"cost-{n}", 3, 60)
    handlers = [EtcdV3RendezvousHandler(RendezvousConfig.from_parameters(params), store=CountingStore(url))
                for _ in range(n)]
    try:
        with ThreadPoolExecutor(n) as pool:
            ranks = sorted(info.rank for info in pool.map(lambda h: h.next_rendezvous(), handlers, timeout=120))
        assert ranks == list(range(n))
        members = [h for h in handlers if not h._view.whole]
        assert len(members) == n - 1, "exactly one member seals"
        return [(h.store.requests, h.store.bytes_received, h._view.events_received,
                 Counter(h.store.calls)) for h in members]
    finally:
        for handler in handlers:
            handler.shutdown()


def test_a_members_cost_of_a_round_is_the_same_at_64_members_as_at_8(etcd_server) -> None:
    small, large = _round_cost(etcd_server.client_url, 8), _round_cost(etcd_server.client_url, 64)
    most = [max(cost[i] for cost in small) for i in range(3)]
    for requests, received, events, calls in large:
        assert requests <= most[0], (requests, most, sorted(calls.items()), "a member's requests grew with the job")
        assert events <= most[2] + 1, (events, most, "a member's watch events grew with the job")
        # one bucket of ranks (at most ~64 members of ~40 bytes) and a few small records, whatever the size
        assert received < 8 * 1024, received


def test_survivors_of_a_silent_loss_are_in_the_next_round_without_writing_their_keys(etcd_server) -> None:
    """The transaction that ends the round on a loss names the survivors in their rank buckets (each member
    watches its own): they are in the next round as they stand, so N survivors make no N writes and the
    sealer waits for no N events before it seals (docs/design.md §3.20)."""
    url, n = etcd_server.client_url, 5
    params = RendezvousParameters("etcd-v3", url, "silent-loss", n - 1, n, local_addr="127.0.0.1",
                                  job="default/silent-loss", lease_seconds=30, last_call_seconds=30)
    handlers = [EtcdV3RendezvousHandler(RendezvousConfig.from_parameters(params), store=CountingStore(url))
                for _ in range(n)]
    keys = JobKeys("default", "silent-loss")
    try:
        with ThreadPoolExecutor(n) as pool:
            first = {h.member_id: info.rank for h, info in
                     zip(handlers, pool.map(lambda h: h.next_rendezvous(), handlers, timeout=120), strict=True)}
            sealer = next(h for h in handlers if h._view.whole)
            lost = next(h for h in handlers if h is not sealer)
            survivors = [h for h in handlers if h is not lost]
            written = {h.member_id: h.store.get(keys.member(h.member_id)).mod_revision for h in survivors}
            lost.store.revoke(lost._member_lease.lease_id)  # its lease lapses: nobody reports anything
            lost._member_lease.stop()

            def rejoin(handler: EtcdV3RendezvousHandler) -> Any:
                # as the in-place agent does: rendezvous again once the handler says the round changed
                assert wait_until(lambda: handler.num_nodes_waiting() > 0, 30), "the loss was never seen"
                return handler.next_rendezvous()

            again = dict(zip([h.member_id for h in survivors], pool.map(rejoin, survivors, timeout=120), strict=True))
        assert sorted(info.rank for info in again.values()) == list(range(n - 1))
        assert all(info.world_size == n - 1 for info in again.values())
        kept = sorted(again, key=lambda member: again[member].rank)
        assert kept == sorted(kept, key=first.__getitem__), "survivors keep their relative order"
        rewritten = {m for m in written if sealer.store.get(keys.member(m)).mod_revision != written[m]}
        assert not rewritten, f"survivors wrote their member keys again: {rewritten}"
    finally:
        for handler in handlers:
            handler.shutdown()
