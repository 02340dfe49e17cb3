"""One connection, one watch stream and one keep-alive stream (elastic.store.watch, elastic.store.keepalive).

Real etcd servers (3.4 and 3.5 where present): etcd still keeps one watcher per watch (its own gauge says
so) and answers each lease's keep-alive, but the client holds one stream of each kind however many watches
and leases it has; the streams' failures (a restart, a frozen etcd, a compacted revision) reach every
watch or lease on them, each on its own terms.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request

import pytest
from pyetcd import exceptions as etcd_exceptions

from elastic.errors import StoreUnavailableError, WatchCompactedError
from elastic.store import LeaseKeeper, PrefixWatch, Store, WatchEvent
from elastic.store.server import EtcdServer
from harness.agents import wait_until


def _watchers(server: EtcdServer) -> float:
    """etcd's own count of the watchers it keeps."""
    with urllib.request.urlopen(f"{server.client_url}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("etcd_debugging_mvcc_watcher_total "):
                return float(line.split()[1])
    raise AssertionError("etcd reports no watcher gauge")


def _events(watch: PrefixWatch, count: int, timeout: float = 10) -> list[WatchEvent]:
    got: list[WatchEvent] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        event = watch.get(timeout=0.2)
        if event is not None:
            got.append(event)
    return got


def test_the_watches_of_one_connection_share_one_stream_and_each_gets_its_own_events(
    own_server: EtcdServer,
) -> None:
    # A server of its own: on a shared one, earlier tests' watchers may still be going (etcd drops a closed
    # stream's watchers after the stream ends), and the count moves under this test.
    with Store(own_server.client_url, retry_seconds=5) as store:
        before = _watchers(own_server)
        watches = [PrefixWatch(store, f"/t/share/{i}/") for i in range(30)]
        try:
            assert all(w.wait_ready(10) for w in watches)
            assert _watchers(own_server) - before == 30, "etcd keeps a watcher per watch"
            assert store.watch_hub.streams_opened == 1
            for i in (0, 7, 29):
                store.put(f"/t/share/{i}/k", str(i))
            for i, watch in enumerate(watches):
                got = _events(watch, 1, timeout=5 if i in (0, 7, 29) else 0.3)
                assert [e.value for e in got] == ([str(i).encode()] if i in (0, 7, 29) else [])
        finally:
            for watch in watches:
                watch.cancel()
        assert wait_until(lambda: _watchers(own_server) == before, 10), "cancelled watchers stay in etcd"


def test_a_cancelled_watch_hears_nothing_more_and_the_others_go_on(store: Store) -> None:
    with PrefixWatch(store, "/t/cancel/") as kept:
        gone = PrefixWatch(store, "/t/cancel/")
        assert kept.wait_ready(5) and gone.wait_ready(5)
        gone.cancel()
        store.put("/t/cancel/a", "1")
        assert [e.key for e in _events(kept, 1)] == ["/t/cancel/a"]
        assert gone.drain() == []


def test_a_watch_of_compacted_revisions_fails_alone(store: Store) -> None:
    first = store.put("/t/compact/a", "1")
    store.put("/t/compact/a", "2")
    latest = store.put("/t/compact/a", "3")
    store.client.compact(latest)
    with PrefixWatch(store, "/t/compact/") as live:
        assert live.wait_ready(5)
        stale = PrefixWatch(store, "/t/compact/", start_revision=first)
        with pytest.raises(WatchCompactedError, match="compacted"):
            stale.get(timeout=5)
        store.put("/t/compact/b", "4")
        assert [e.value for e in _events(live, 1)] == [b"4"], "the stream's other watch goes on"
        stale.cancel()


def test_every_watch_of_a_connection_resumes_after_an_etcd_restart(own_server: EtcdServer) -> None:
    with Store(own_server.client_url, retry_seconds=20) as store:
        watches = [PrefixWatch(store, f"/t/restart/{name}/") for name in ("a", "b")]
        assert all(w.wait_ready(5) for w in watches)
        own_server.kill()
        own_server.start()
        for i in range(3):
            for name in ("a", "b"):
                store.put(f"/t/restart/{name}/{i}", str(i))
        for watch in watches:
            got = _events(watch, 3, timeout=15)
            time.sleep(0.3)  # a duplicate would arrive right behind the last event
            got += watch.drain()
            assert [e.value for e in got] == [b"0", b"1", b"2"], watch.prefix
            watch.cancel()
        assert store.watch_hub.streams_opened >= 2, "the stream should have been opened again"


def test_the_leases_of_one_connection_are_kept_alive_on_one_stream(store: Store) -> None:
    keepers = [LeaseKeeper.grant(store, ttl=2) for _ in range(40)]
    try:
        # several refreshes of every lease, and past its TTL: each was kept alive by its own keep-alives
        assert wait_until(lambda: store.keep_alives.streams_opened >= 1, 5)
        time.sleep(3)
        assert not any(k.lost.is_set() for k in keepers), [k.lost_reason for k in keepers if k.lost.is_set()]
        assert all(store.lease_ttl(k.lease_id) > 0 for k in keepers)
        assert store.keep_alives.streams_opened == 1
        store.revoke(keepers[0].lease_id)
        assert store.refresh_once(keepers[0].lease_id) == 0, "a revoked lease's keep-alive says it is gone"
        assert store.refresh_once(keepers[1].lease_id) > 0
    finally:
        for keeper in keepers:
            keeper.stop()


def test_an_unanswered_keep_alive_ends_its_stream_and_the_next_opens_another(
    stoppable_etcd_server: EtcdServer,
) -> None:
    """A frozen etcd (SIGSTOP) leaves the stream half-open: nothing comes back and nothing breaks. The keep-alive
    times out (a transient error its keeper retries) and the stream is dropped, so that the next keep-alive
    does not wait on a dead stream."""
    pid = stoppable_etcd_server.process.pid  # type: ignore[union-attr]
    with Store(stoppable_etcd_server.client_url, retry_seconds=5, timeout=1.0) as store:
        lease = store.grant(30)
        assert store.refresh_once(lease) > 0
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(etcd_exceptions.ConnectionTimeoutError):
                store.refresh_once(lease)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert wait_until(lambda: _refreshes(store, lease), 10)
        assert store.keep_alives.streams_opened >= 2


def _refreshes(store: Store, lease: int) -> bool:
    try:
        return store.refresh_once(lease) > 0
    except (etcd_exceptions.ConnectionTimeoutError, etcd_exceptions.ConnectionFailedError,
            etcd_exceptions.NoServerAvailableError):
        return False


def test_closing_the_connection_ends_its_watches_with_an_error(any_etcd_server: EtcdServer) -> None:
    store = Store(any_etcd_server.client_url, retry_seconds=5)
    watch = PrefixWatch(store, "/t/closed/")
    assert watch.wait_ready(5)
    store.close()
    with pytest.raises(StoreUnavailableError, match="closed"):
        watch.get(timeout=5)
