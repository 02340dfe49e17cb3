"""The etcd v3 client wrapper over gRPC: what controllers and the CLI talk to etcd with.

Built on `etcd-sdk-python` (module `pyetcd`, the maintained fork of `etcd3` that imports with today's
protobuf). Nothing outside this package imports `pyetcd`, so the client can be swapped. A process that forks
(an agent, a training process) uses `gateway.GatewayStore` instead, the same calls over etcd's HTTP/JSON
gateway.

Why a wrapper at all: callers want JSON values, compare-and-set keyed on mod revision, bounded retries of
transient failures and one readable error when etcd is really gone, not a gRPC stack dump.
"""

from __future__ import annotations

import contextlib
import logging
import queue
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import grpc
import pyetcd
from pyetcd import exceptions as etcd_exceptions
from pyetcd import transactions as etcd_txn

from elastic.errors import StoreUnavailableError
from elastic.store.base import StoreBase
from elastic.store.ops import (
    Compare,
    Entry,
    ModRevisionIs,
    Op,
    Put,
    TxnResult,
    UnchangedSince,
    prefix_range_end,
    txn_subject,
)

if TYPE_CHECKING:
    from elastic.store.keepalive import KeepAliveStream
    from elastic.store.watch_stream import WatchHub

log = logging.getLogger(__name__)

# Errors after which the same call may succeed on the next try (or on the next endpoint).
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    etcd_exceptions.ConnectionFailedError,
    etcd_exceptions.ConnectionTimeoutError,
    etcd_exceptions.NoServerAvailableError,
    etcd_exceptions.InternalServerError,
)

# Reconnect quickly after an etcd restart: gRPC's default backoff grows to two minutes.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
]

# How long a failed endpoint is skipped before it is tried again (pyetcd's default is 300 s, which would
# turn a one-second etcd restart into five minutes of "no server available").
ENDPOINT_RETRY_AFTER_SECONDS = 0.3


def stream_requests(requests: queue.Queue[Any]) -> Iterator[Any]:
    """The requests of one bidirectional stream, as they are queued, until a None: gRPC reads this iterator on a
    thread of its own, which the None ends."""
    while (request := requests.get()) is not None:
        yield request


class Store(StoreBase):
    """A gRPC connection to one etcd cluster (see `StoreBase`): every watch of it rides one Watch stream and
    every lease one LeaseKeepAlive stream, as etcd's Go client multiplexes them."""

    transient_errors = TRANSIENT_ERRORS
    refusal_errors = (grpc.RpcError,)

    def _setup(self) -> None:
        self._client: pyetcd.MultiEndpointEtcd3Client | None = None
        self._keep_alives: KeepAliveStream | None = None

    # --- connection ---

    @property
    def client(self) -> pyetcd.MultiEndpointEtcd3Client:
        """The pyetcd client, created on first use (authentication is itself a call that may fail)."""
        if self._client is None:
            self._client = self._call("connect", self._connect)
        return self._client

    def _connect(self) -> pyetcd.MultiEndpointEtcd3Client:
        creds = self.auth.channel_credentials() if any(a.secure for a in self.addresses) else None
        endpoints = [
            pyetcd.Endpoint(
                a.host,
                a.port,
                secure=a.secure,
                creds=creds if a.secure else None,
                time_retry=ENDPOINT_RETRY_AFTER_SECONDS,
                opts=CHANNEL_OPTIONS,
            )
            for a in self.addresses
        ]
        try:
            return pyetcd.MultiEndpointEtcd3Client(
                endpoints=endpoints,
                timeout=self.timeout,
                user=self.auth.user,
                password=self.auth.password,
                failover=True,
            )
        except grpc.RpcError as err:  # pyetcd's Authenticate call is not behind its own error mapping
            if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise etcd_exceptions.ConnectionFailedError() from err
            raise

    def _new_watch_hub(self) -> WatchHub:
        """The one Watch stream that every watch of this connection rides (elastic.store.watch_stream)."""
        from elastic.store.watch_stream import WatchHub

        return WatchHub(self)

    @property
    def keep_alives(self) -> KeepAliveStream:
        """The one LeaseKeepAlive stream that every lease of this connection is refreshed on."""
        with self._streams_lock:
            if self._keep_alives is None:
                from elastic.store.keepalive import KeepAliveStream

                self._keep_alives = KeepAliveStream(self)
            return self._keep_alives

    def fail_endpoint(self) -> None:
        """Mark the endpoint in use as failed, so that the next stream (watch, keep-alive) goes to another one;
        unary calls do this themselves (pyetcd), a stream that broke must say so."""
        with contextlib.suppress(pyetcd.Etcd3Exception, StoreUnavailableError):
            self.client.endpoint_in_use.fail()

    def _close_streams(self) -> list[Any]:
        streams = super()._close_streams()
        with self._streams_lock:
            keep_alives, self._keep_alives = self._keep_alives, None
        return [*streams, keep_alives]

    def close(self) -> None:
        for stream in self._close_streams():
            if stream is not None:
                stream.close()
        if self._client is not None:
            self._client.close()
            self._client = None

    def tls_failure(self, err: BaseException) -> str | None:
        return _tls_failure(err)

    def describe_error(self, err: BaseException) -> str:
        return describe_error(err)

    def refused(self, what: str, err: BaseException) -> StoreUnavailableError:
        assert isinstance(err, grpc.RpcError)
        return self.refusal(what, _status_name(err), _rpc_details(err))

    # --- key/value ---

    def get(self, key: str) -> Entry | None:
        response = self._call(f"get {key}", lambda: self.client.get_response(key))
        return _entry(response.kvs[0]) if response.kvs else None

    def get_prefix(self, prefix: str) -> tuple[list[Entry], int]:
        response = self._call(
            f"get --prefix {prefix}",
            lambda: self.client.get_prefix_response(prefix, sort_order="ascend", sort_target="key"),
        )
        return [_entry(kv) for kv in response.kvs], response.header.revision

    def get_ranges(self, ranges: Sequence[tuple[str, str]]) -> tuple[list[Entry], int]:
        def run() -> Any:
            client = self.client
            reads = [pyetcd.transactions.Get(start, end) for start, end in ranges]
            return self._send_txn(pyetcd.etcdrpc.TxnRequest(success=client._ops_to_requests(reads)))

        response = self._call("get " + ", ".join(f"{start}..{end}" for start, end in ranges), run)
        entries = [_entry(kv) for answer in response.responses for kv in answer.response_range.kvs]
        return entries, response.header.revision

    def put(self, key: str, value: bytes | str, lease: int | None = None) -> int:
        response = self._call(f"put {key}", lambda: self.client.put(key, value, lease=lease))
        return int(response.header.revision)

    def delete(self, key: str) -> bool:
        return bool(self._call(f"delete {key}", lambda: self.client.delete(key)))

    def delete_prefix(self, prefix: str) -> int:
        response = self._call(f"delete --prefix {prefix}", lambda: self.client.delete_prefix(prefix))
        return int(response.deleted)

    def txn(self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()) -> TxnResult:
        def run() -> TxnResult:
            client = self.client
            response = self._send_txn(pyetcd.etcdrpc.TxnRequest(
                compare=[_compare(c).build_message() for c in compare],
                success=client._ops_to_requests([_op(o) for o in success]),
                failure=client._ops_to_requests([_op(o) for o in failure]),
            ))
            return TxnResult(response.succeeded, response.header.revision)

        return self._call(txn_subject(compare, success, failure), run)

    def _send_txn(self, request: Any) -> Any:
        """Send one TxnRequest (one attempt), its gRPC errors mapped as pyetcd maps those of its own calls."""
        client = self.client
        try:
            return client.kvstub.Txn(request, client.timeout, credentials=client.call_credentials,
                                     metadata=client.metadata)
        except grpc.RpcError as err:
            client._manage_grpc_errors(err)
            raise  # pragma: no cover - pyetcd raises its own error for every gRPC one

    # --- leases ---

    def grant(self, ttl: int) -> int:
        return int(self._call(f"lease grant {ttl}", lambda: self.client.lease(ttl)).id)

    def refresh_once(self, lease_id: int) -> int:
        return self.keep_alives.refresh(lease_id, self.timeout)

    def revoke(self, lease_id: int) -> None:
        def run() -> None:
            try:
                self.client.revoke_lease(lease_id)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.NOT_FOUND:
                    raise

        self._call(f"lease revoke {lease_id:x}", run)

    def lease_ttl(self, lease_id: int) -> int:
        return int(self._call("lease timetolive", lambda: self.client.get_lease_info(lease_id)).TTL)


def _status_name(err: grpc.RpcError) -> str:
    code = err.code() if hasattr(err, "code") else None
    return code.name if code is not None else "UNKNOWN"


def _entry(kv: Any) -> Entry:
    return Entry(kv.key.decode(), bytes(kv.value), kv.mod_revision, kv.create_revision, kv.lease)


def _compare(c: Compare) -> etcd_txn.BaseCompare:
    if isinstance(c, ModRevisionIs):
        return etcd_txn.Mod(c.key) == c.revision
    if isinstance(c, UnchangedSince):
        return etcd_txn.Mod(c.prefix, range_end=prefix_range_end(c.prefix.encode())) < c.revision + 1
    return etcd_txn.Value(c.key) == c.value


def _op(o: Op) -> Any:
    if isinstance(o, Put):
        return etcd_txn.Put(o.key, o.value, lease=o.lease)
    if o.prefix:
        return etcd_txn.Delete(o.key, range_end=prefix_range_end(o.key.encode()))
    return etcd_txn.Delete(o.key)


def describe_error(err: BaseException) -> str:
    """An etcd client error in a few words (a bare gRPC error's str() is empty: its code and details)."""
    if isinstance(err, etcd_exceptions.NoServerAvailableError):
        return "no endpoint reachable"
    if isinstance(err, grpc.RpcError) and hasattr(err, "code"):
        return f"{err.code().name}: {_rpc_details(err)}"
    return str(err) or type(err).__name__


# What gRPC's connection errors say when TLS, not the network, is the problem; and what to do about it.
TLS_FAILURES = {
    "CERTIFICATE_VERIFY_FAILED": "etcd's certificate is not signed by the CA given (--etcd-cacert), or does not "
    "name the endpoint's host",
    **dict.fromkeys(
        # With TLS 1.3 the server checks the client's certificate after the handshake and drops the connection.
        ("ALERT_BAD_CERTIFICATE", "CERTIFICATE_REQUIRED", "Unwrap failed"),
        "etcd refused this client's certificate, or it has none: etcd started with --client-cert-auth needs one "
        "signed by a CA it trusts (--etcd-cert/--etcd-key)",
    ),
    "handshake failed": "check --etcd-cacert and --etcd-cert/--etcd-key",
}


def _tls_failure(err: BaseException) -> str | None:
    """Why a connection failed, if TLS was the cause (pyetcd keeps gRPC's error as the context of its own):
    a wrong CA or a missing client certificate never heals by retrying."""
    cause = err.__cause__ or err.__context__
    text = _rpc_details(cause) if isinstance(cause, grpc.RpcError) else ""
    for marker, advice in TLS_FAILURES.items():
        if marker.lower() in text.lower():
            detail = text.split("last error: ", 1)[-1].removesuffix(": OK")
            return f"{advice} ({detail})"
    return None


def _rpc_details(err: grpc.RpcError) -> str:
    details = err.details() if hasattr(err, "details") else None
    return details or str(err)
