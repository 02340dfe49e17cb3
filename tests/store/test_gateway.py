"""The HTTP/JSON gateway wire (`GatewayStore`, what a training process talks to etcd with) against a real etcd
of every version present, beside the gRPC `Store`: the same calls give the same answers, watches resume
across a crash with every event once, and a dead endpoint is one readable error."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from elastic.errors import LeaseLostError, StoreUnavailableError, WatchCompactedError
from elastic.store import (
    Delete,
    GatewayStore,
    JobKeys,
    ModRevisionIs,
    PrefixWatch,
    Put,
    Store,
    StoreAccessError,
    StoreBase,
    UnchangedSince,
    ValueIs,
)
from elastic.store.server import EtcdServer
from harness.fixtures import Certificates, grant_job_role


@pytest.fixture
def gateway(any_etcd_server: EtcdServer) -> Iterator[GatewayStore]:
    with GatewayStore(any_etcd_server.client_url, retry_seconds=5) as store:
        yield store


def test_both_wires_read_what_the_other_wrote(any_etcd_server: EtcdServer) -> None:
    with Store(any_etcd_server.client_url) as grpc_store, GatewayStore(any_etcd_server.client_url) as gateway:
        grpc_store.put("/t/gw/both/a", b"\x00\xffbinary")
        revision = gateway.put("/t/gw/both/b", "text é")
        gateway.put_json("/t/gw/both/c", {"x": [1, 2]})
        assert gateway.get("/t/gw/both/a").value == b"\x00\xffbinary"
        assert grpc_store.get("/t/gw/both/b").value == "text é".encode()
        assert grpc_store.get("/t/gw/both/b").mod_revision == revision
        assert grpc_store.get_json("/t/gw/both/c") == {"x": [1, 2]}
        assert gateway.get_prefix("/t/gw/both/") == grpc_store.get_prefix("/t/gw/both/")
        ranges = [("/t/gw/both/a", "/t/gw/both/b"), ("/t/gw/both/c", "/t/gw/both/d")]
        assert gateway.get_ranges(ranges) == grpc_store.get_ranges(ranges)
        assert gateway.get("/t/gw/both/none") is None
        assert gateway.get_prefix("/t/gw/nothing/")[0] == []


def test_transactions_compare_as_the_grpc_wire_does(gateway: GatewayStore) -> None:
    first = gateway.txn([ModRevisionIs("/t/gw/txn/k", 0)], [Put("/t/gw/txn/k", "1")])
    assert first.succeeded
    assert not gateway.txn([ModRevisionIs("/t/gw/txn/k", 0)], [Put("/t/gw/txn/k", "2")]).succeeded
    assert gateway.txn([ModRevisionIs("/t/gw/txn/k", first.revision)], [Put("/t/gw/txn/k", "2")]).succeeded
    assert gateway.txn([ValueIs("/t/gw/txn/k", "2")], [Put("/t/gw/txn/other", "x")]).succeeded
    failed = gateway.txn([ValueIs("/t/gw/txn/k", "1")], [Put("/t/gw/txn/k", "no")], [Put("/t/gw/txn/k", "else")])
    assert not failed.succeeded and gateway.get("/t/gw/txn/k").value == b"else"
    seen = gateway.revision()
    assert gateway.txn([UnchangedSince("/t/gw/txn/", seen)], [Put("/t/gw/txn/x", "1")]).succeeded
    assert not gateway.txn([UnchangedSince("/t/gw/txn/", seen)], [Put("/t/gw/txn/y", "1")]).succeeded
    assert gateway.txn([], [Delete("/t/gw/txn/", prefix=True)]).succeeded
    assert gateway.get_prefix("/t/gw/txn/")[0] == []


def test_cas_race_exactly_one_writer_wins_on_either_wire(any_etcd_server: EtcdServer, wire: type[StoreBase]) -> None:
    winners: list[int] = []

    def race(i: int) -> None:
        with wire(any_etcd_server.client_url) as store:
            if store.txn([ModRevisionIs(f"/t/gw/race/{wire.__name__}", 0)],
                         [Put(f"/t/gw/race/{wire.__name__}", str(i))]).succeeded:
                winners.append(i)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(winners) == 1


def test_leases_expire_and_revoke_and_a_write_under_a_lost_lease_says_so(gateway: GatewayStore) -> None:
    lease = gateway.grant(2)
    gateway.put("/t/gw/lease/a", "x", lease=lease)
    assert gateway.get("/t/gw/lease/a").lease == lease
    assert gateway.refresh_once(lease) > 0
    assert 0 < gateway.lease_ttl(lease) <= 2
    gateway.revoke(lease)
    assert gateway.get("/t/gw/lease/a") is None
    assert gateway.lease_ttl(lease) == -1
    gateway.revoke(lease)  # already gone: fine
    assert gateway.refresh_once(lease) == 0
    with pytest.raises(LeaseLostError, match="lease not found"):
        gateway.put("/t/gw/lease/b", "x", lease=lease)


def test_watch_delivers_puts_and_deletes_in_order_and_ends_when_compacted(gateway: GatewayStore) -> None:
    with PrefixWatch(gateway, "/t/gw/watch/") as watch:
        assert watch.wait_ready(5)
        gateway.put("/t/gw/watch/a", "1")
        gateway.put("/t/gw/watch/b", "2")
        gateway.delete("/t/gw/watch/a")
        events = [watch.get(timeout=5) for _ in range(3)]
    assert [(e.kind, e.key, e.value) for e in events] == [
        ("put", "/t/gw/watch/a", b"1"), ("put", "/t/gw/watch/b", b"2"), ("delete", "/t/gw/watch/a", b"")]
    with Store(gateway.endpoints_text) as grpc_store:
        old = grpc_store.put("/t/gw/watch/c", "3")
        grpc_store.put("/t/gw/watch/c", "4")
        grpc_store.client.compact(grpc_store.revision())
    with PrefixWatch(gateway, "/t/gw/watch/", start_revision=old) as late, pytest.raises(WatchCompactedError):
        late.get(timeout=5)


def test_closing_the_connection_ends_its_watches(any_etcd_server: EtcdServer) -> None:
    store = GatewayStore(any_etcd_server.client_url)
    watch = PrefixWatch(store, "/t/gw/closing/")
    assert watch.wait_ready(5)
    store.close()
    with pytest.raises(StoreUnavailableError, match="was closed"):
        watch.get(timeout=5)


def test_tls_and_a_per_job_user_reach_their_keys_and_only_them(
    secure_etcd: EtcdServer, certificates: Certificates
) -> None:
    job = JobKeys("default", "gateway-tls")
    grant_job_role(secure_etcd, job, "gateway-agent", "gateway-password")
    auth = certificates.client_auth(user="gateway-agent", password="gateway-password")
    with GatewayStore(secure_etcd.client_url, auth=auth) as store:
        store.put(job.prefix + "a", "1")
        assert store.get(job.prefix + "a").value == b"1"
        with PrefixWatch(store, job.prefix) as watch:
            assert watch.wait_ready(5)
            store.put(job.prefix + "b", "2")
            assert watch.get(timeout=5).key == job.prefix + "b"
        with pytest.raises(StoreAccessError, match=r"permission denied.*has no role"):
            store.put("/elastic/jobs/default/other-job/a", "1")
    named = {"cert": str(certificates.named_client_cert), "key": str(certificates.named_client_key)}
    with GatewayStore(secure_etcd.client_url, auth=certificates.client_auth(
            user="gateway-agent", password="gateway-password", **named)) as store, \
            pytest.raises(StoreAccessError, match="certificate without a CommonName"):
        store.get(job.prefix + "a")  # a certificate naming a user: refused by etcd's gateway, and said why
    wrong_ca = certificates.client_auth(ca_cert=str(certificates.other_ca_cert), user="gateway-agent",
                                        password="gateway-password")
    with GatewayStore(secure_etcd.client_url, auth=wrong_ca, retry_seconds=2) as store, \
            pytest.raises(StoreAccessError, match="TLS failed"):
        store.get(job.prefix + "a")
