"""A member learns its rank from its own bucket of the ranks, which it watches beside the round record (issue 27,
docs/design.md §3.20): the seal writes both at one revision, but they come on two watches of one stream, in
either order, and nobody may see its round sealed without its own rank (it would take itself for left out).
Real etcd; the order of the two watches' answers cannot be forced through etcd, so the view's holding step is
also fed a queue in each order."""

from __future__ import annotations

import queue
import secrets
from typing import Any

import pytest

from elastic.rendezvous import view as view_module
from elastic.rendezvous.run import JobRun
from elastic.rendezvous.state import Round, bucket_mask, bucket_of
from elastic.rendezvous.view import JobView
from elastic.store import JobKeys, Put, Store
from elastic.store.ops import dumps
from elastic.store.watch import WatchEvent
from harness.agents import wait_until

MEMBER = "m1"


def _seal(store: Store, keys: JobKeys, ranks: dict[str, int], round_number: int = 1) -> int:
    """Seal a round as `JobRun.seal` writes it: the round record and the buckets, in one transaction."""
    buckets: dict[int, dict[str, int]] = {}
    for member, rank in ranks.items():
        buckets.setdefault(bucket_of(member), {})[member] = rank
    sealed = Round(round_number, sealed=True, size=len(ranks), rank_buckets=bucket_mask(buckets))
    ops = [Put.json(keys.round, sealed.to_json()),
           *(Put.json(keys.rank_bucket(b), {"round": round_number, "ranks": part}) for b, part in buckets.items())]
    return store.txn([], ops).revision


def _event(key: str, value: Any, revision: int) -> WatchEvent:
    return WatchEvent("put", key, dumps(value).encode(), revision)


@pytest.fixture
def member_view(store: Store):
    keys = JobKeys("default", f"own-rank-{secrets.token_hex(4)}")
    store.put_json(keys.round, Round(1).to_json())
    view = JobView(JobRun(store, keys), member=MEMBER)
    yield view, keys
    view.close()


def test_a_member_sees_its_round_sealed_with_its_rank_and_reads_nothing(store: Store, member_view) -> None:
    view, keys = member_view
    reads = []
    original_get = store.get_ranges
    store.get_ranges = lambda ranges: reads.append(ranges) or original_get(ranges)  # type: ignore[method-assign]
    try:
        _seal(store, keys, {"m0": 0, MEMBER: 1, "m2": 2})
        # the bucket may come first (the view's revision then moves before the round does): wait for the seal
        assert wait_until(lambda: (view.state().round or Round(0)).sealed, 10)
        state = view.state()
        assert state.round is not None and state.round.members[MEMBER] == 1 and state.round.world_size == 3
    finally:
        store.get_ranges = original_get  # type: ignore[method-assign]
    assert reads == [], "the rank came on the member's watch, not from a read"


def test_a_seal_that_wrote_our_bucket_is_held_until_the_bucket_comes(member_view) -> None:
    view, keys = member_view
    bucket = keys.rank_bucket(bucket_of(MEMBER))
    sealed = Round(2, sealed=True, size=1, rank_buckets=bucket_mask([bucket_of(MEMBER)]))
    batch: list[Any] = [_event(keys.round, sealed.to_json(), 40)]
    later: queue.Queue[Any] = queue.Queue()
    later.put(_event(bucket, {"round": 2, "ranks": {MEMBER: 0}}, 40))
    view._hold_for_own_rank(later, batch)
    assert [e.key for e in batch] == [keys.round, bucket]


def test_a_bucket_ahead_of_its_round_record_is_held_until_the_record_comes(member_view) -> None:
    """A seal right after the end of the round before: the new ranks must not be seen beside the old, open
    round record (the member would take itself for not expected, and write its key again)."""
    view, keys = member_view
    bucket = keys.rank_bucket(bucket_of(MEMBER))
    sealed_at = view.revision + 5  # after the round record the view holds (the session's etcd is shared)
    batch: list[Any] = [_event(bucket, {"round": 2, "ranks": {MEMBER: 0}}, sealed_at)]
    later: queue.Queue[Any] = queue.Queue()
    later.put(_event(keys.round, Round(2, sealed=True, size=1, rank_buckets=bucket_mask([bucket_of(MEMBER)])).to_json(),
                     sealed_at))
    view._hold_for_own_rank(later, batch)
    assert [e.key for e in batch] == [bucket, keys.round]


def test_a_bucket_that_does_not_come_is_read(store: Store, member_view, monkeypatch: pytest.MonkeyPatch) -> None:
    view, keys = member_view
    monkeypatch.setattr(view_module, "OWN_RANK_WAIT_SECONDS", 0.2)
    view.close()  # its watch must not bring the bucket first: then there would be nothing to read
    sealed_at = _seal(store, keys, {MEMBER: 0}, round_number=3)
    batch: list[Any] = [_event(keys.round, Round(3, sealed=True, size=1,
                                                 rank_buckets=bucket_mask([bucket_of(MEMBER)])).to_json(), sealed_at)]
    view._hold_for_own_rank(queue.Queue(), batch)
    read = batch[-1]
    assert read.key == keys.rank_bucket(bucket_of(MEMBER)) and read.revision == sealed_at


def test_a_seal_that_did_not_write_our_bucket_is_not_held(member_view) -> None:
    """A member left out of the round (a spare, a late joiner) learns it from the round record alone."""
    view, keys = member_view
    other = next(b for b in range(48) if b != bucket_of(MEMBER))
    batch: list[Any] = [_event(keys.round, Round(4, sealed=True, size=1, rank_buckets=bucket_mask([other])).to_json(),
                               50)]
    view._hold_for_own_rank(queue.Queue(), batch)  # an empty queue: holding would wait, then read
    assert len(batch) == 1
