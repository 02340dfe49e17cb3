"""The store layer against a real etcd (every version present on the machine)."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from elastic.errors import StoreUnavailableError
from elastic.store import (
    LeaseKeeper,
    ModRevisionIs,
    PrefixWatch,
    Put,
    Store,
    StoreBase,
    UnchangedSince,
)
from elastic.store.server import EtcdServer, free_port
from harness.agents import wait_until


def test_json_round_trip(store: Store) -> None:
    store.put_json("/t/json/a", {"round": 3, "members": {"m1": 0}})
    assert store.get_json("/t/json/a") == {"round": 3, "members": {"m1": 0}}
    assert store.get_json("/t/json/missing", default="none") == "none"


def test_cas_race_exactly_one_writer_wins(store: Store) -> None:
    """Two writers create the same key at once; one wins, the loser then reads the winner's value."""
    for attempt in range(20):
        key = f"/t/cas/{attempt}"
        barrier = threading.Barrier(2)
        results: dict[str, bool] = {}

        def write(name: str, key: str = key, barrier: threading.Barrier = barrier, results=results) -> None:
            barrier.wait()
            results[name] = store.txn([ModRevisionIs(key, 0)], [Put.json(key, {"writer": name})]).succeeded

        threads = [threading.Thread(target=write, args=(n,)) for n in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [n for n, won in results.items() if won]
        assert len(winners) == 1, results
        loser = "b" if winners[0] == "a" else "a"
        assert not results[loser]
        assert store.get_json(key) == {"writer": winners[0]}


def test_cas_on_mod_revision_rejects_a_stale_writer(store: Store) -> None:
    store.put_json("/t/cas/stale", {"v": 1})
    seen = store.get("/t/cas/stale")
    assert seen is not None
    store.put_json("/t/cas/stale", {"v": 2})
    assert not store.txn([ModRevisionIs(seen.key, seen.mod_revision)], [Put.json(seen.key, {"v": 3})]).succeeded
    assert store.get_json("/t/cas/stale") == {"v": 2}


def test_unchanged_since_is_one_comparison_over_a_whole_prefix(store: Store) -> None:
    """How a round of 128+ members is sealed under etcd's default cap of 128 comparisons per transaction."""
    for i in range(200):
        store.put_json(f"/t/unchanged/members/m{i:03d}", {"round": 0})
    read_at = store.get_prefix("/t/unchanged/members/")[1]
    seal = [UnchangedSince("/t/unchanged/members/", read_at)]
    assert store.txn(seal, [Put.json("/t/unchanged/round", {"sealed": True})]).succeeded
    store.put_json("/t/unchanged/members/m007", {"round": 1})  # a member key written after the read
    assert not store.txn(seal, [Put.json("/t/unchanged/round", {"sealed": False})]).succeeded
    assert store.get_json("/t/unchanged/round") == {"sealed": True}


def test_unrefreshed_lease_expires_within_ttl_and_watch_sees_delete(store: Store) -> None:
    lease = store.grant(2)
    start_rev = store.revision() + 1
    store.put("/t/lease/member", "x", lease=lease)
    granted = time.monotonic()
    with PrefixWatch(store, "/t/lease/", start_revision=start_rev) as watch:
        put = watch.get(timeout=5)
        assert put is not None and put.kind == "put"
        delete = watch.get(timeout=2 + 1 + 1)
        gone_after = time.monotonic() - granted
    assert delete is not None and delete.kind == "delete" and delete.key == "/t/lease/member"
    assert gone_after <= 2 + 1 + 0.5, f"lease of 2 s took {gone_after:.1f} s to expire"
    assert store.get("/t/lease/member") is None


def test_kept_lease_outlives_its_ttl_and_revoke_removes_keys(store: Store) -> None:
    keeper = LeaseKeeper.grant(store, ttl=1)
    store.put("/t/kept/member", "x", lease=keeper.lease_id)
    time.sleep(2.5)  # deliberately longer than the TTL: the key must still be there
    assert store.get("/t/kept/member") is not None
    assert not keeper.lost.is_set()
    keeper.revoke()
    assert store.get("/t/kept/member") is None


def test_keeper_reports_a_lease_revoked_elsewhere(store: Store) -> None:
    lost: list[str] = []
    keeper = LeaseKeeper.grant(store, ttl=2, on_lost=lost.append)
    store.revoke(keeper.lease_id)
    assert keeper.lost.wait(timeout=5)
    assert lost and "expired or was revoked" in lost[0]



class _DeadlineExceeded(grpc.RpcError):
    """What an overloaded etcd answers a keep-alive (pyetcd raises it bare): UNKNOWN, context deadline exceeded."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNKNOWN

    def details(self) -> str:
        return "context deadline exceeded"


class _OverloadedStore(Store):
    """A real etcd, with keep-alives failing as an overloaded one fails them while `overloaded` is set."""

    overloaded = threading.Event()

    def refresh_once(self, lease_id: int) -> int:
        if self.overloaded.is_set():
            raise _DeadlineExceeded()
        return super().refresh_once(lease_id)


def test_keeper_rides_out_an_overloaded_etcd_and_says_when_the_lease_is_lost(etcd_server: EtcdServer) -> None:
    with _OverloadedStore(etcd_server.client_url) as store:
        keeper = LeaseKeeper.grant(store, ttl=3)
        store.overloaded.set()
        assert wait_until(lambda: keeper.last_failure is not None, 5), "the keep-alive should have failed"
        store.overloaded.clear()
        time.sleep(4)  # longer than the TTL: the keeper must have refreshed after the overload
        assert not keeper.lost.is_set(), keeper.lost_reason
        assert store.lease_ttl(keeper.lease_id) > 0
        store.overloaded.set()  # now for longer than the TTL: lost, and said so, never a thread dying unseen
        assert keeper.lost.wait(timeout=10)
        assert "no keep-alive reached etcd for 3 s" in keeper.lost_reason and "deadline" in keeper.lost_reason
        store.overloaded.clear()
        keeper.stop()

def test_watch_resumes_after_etcd_crash_with_every_event_once_in_order(
    own_server: EtcdServer, wire: type[StoreBase]
) -> None:
    with wire(own_server.client_url, retry_seconds=20) as store, PrefixWatch(store, "/t/w/") as watch:
        assert watch.wait_ready(5)
        for i in range(5):
            store.put(f"/t/w/{i}", str(i))
        received = [watch.get(timeout=5) for _ in range(5)]
        assert None not in received, "events before the crash should arrive"
        own_server.kill()
        own_server.start()
        for i in range(5, 10):
            store.put(f"/t/w/{i}", str(i))
        deadline = time.monotonic() + 15
        while len(received) < 10 and time.monotonic() < deadline:
            event = watch.get(timeout=0.5)
            if event is not None:
                received.append(event)
        time.sleep(0.5)  # a duplicate would arrive right behind the last event
        received += watch.drain()
        reconnects = watch.reconnects
    assert [e.value.decode() for e in received] == [str(i) for i in range(10)]
    assert [e.revision for e in received] == sorted(e.revision for e in received)
    assert reconnects >= 1, "the watch should have lived through a reconnect"


def test_keeper_rides_out_an_etcd_restart(own_server: EtcdServer) -> None:
    with Store(own_server.client_url, retry_seconds=20) as store:
        keeper = LeaseKeeper.grant(store, ttl=3)
        store.put("/t/ride/member", "x", lease=keeper.lease_id)
        own_server.kill()
        own_server.start()
        time.sleep(4)  # longer than the TTL: the keeper must have refreshed across the restart
        assert not keeper.lost.is_set(), keeper.lost_reason
        assert store.get("/t/ride/member") is not None
        keeper.revoke()


def test_dead_endpoints_fail_within_bound_with_one_readable_error(wire: type[StoreBase]) -> None:
    dead = [f"http://127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    with wire(dead, retry_seconds=1.5, timeout=0.5) as store:
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as caught:
            store.get("/anything")
        took = time.monotonic() - started
    message = str(caught.value)
    assert took < 1.5 + 2.0
    assert dead[0] in message and dead[1].split(":")[1] in message
    assert "Check that etcd is running" in message
    assert "Traceback" not in message and "grpc" not in message.lower()


def test_failover_to_a_live_endpoint(any_etcd_server: EtcdServer, wire: type[StoreBase]) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with wire([dead, any_etcd_server.client_url], retry_seconds=5, timeout=1) as store:
        for i in range(5):  # whichever endpoint is picked first, every call lands
            store.put(f"/t/failover/{i}", "x")
        assert len(store.get_prefix("/t/failover/")[0]) == 5
