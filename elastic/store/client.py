"""The etcd v3 client wrapper: the only code that talks to etcd.

Built on `etcd-sdk-python` (module `pyetcd`, the maintained fork of `etcd3` that imports with today's
protobuf). Nothing outside this package imports `pyetcd`, so the client can be swapped.

Why a wrapper at all: callers want JSON values, compare-and-set keyed on mod revision, bounded retries of
transient failures and one readable error when etcd is really gone, not a gRPC stack dump.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import pyetcd
from pyetcd import exceptions as etcd_exceptions
from pyetcd import transactions as etcd_txn
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from elastic.errors import LeaseLostError, StoreUnavailableError
from elastic.store.auth import EtcdAuth, StoreAccessError
from elastic.store.endpoints import EndpointAddress, parse_endpoints

if TYPE_CHECKING:
    from elastic.store.keepalive import KeepAliveStream
    from elastic.store.watch import WatchHub

log = logging.getLogger(__name__)

T = TypeVar("T")

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


@dataclass(frozen=True)
class Entry:
    """One key as read from etcd."""

    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    lease: int


# --- transaction vocabulary (kept free of pyetcd types so callers stay client-agnostic) ---


@dataclass(frozen=True)
class ModRevisionIs:
    """The key was last written at this revision; 0 means the key must not exist."""

    key: str
    revision: int


@dataclass(frozen=True)
class UnchangedSince:
    """No key under `prefix` was written after `revision` (one comparison, however many keys).

    etcd caps a transaction's comparisons (--max-txn-ops, 128 by default): comparing every member key one
    by one would make rounds of 128+ members impossible to seal.
    """

    prefix: str
    revision: int


@dataclass(frozen=True)
class ValueIs:
    key: str
    value: bytes | str


@dataclass(frozen=True)
class Put:
    key: str
    value: bytes | str
    lease: int | None = None

    @classmethod
    def json(cls, key: str, obj: Any, lease: int | None = None) -> Put:
        return cls(key, dumps(obj), lease)


@dataclass(frozen=True)
class Delete:
    key: str
    prefix: bool = False


Compare = ModRevisionIs | UnchangedSince | ValueIs
Op = Put | Delete


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int


def stream_requests(requests: queue.Queue[Any]) -> Iterator[Any]:
    """The requests of one bidirectional stream, as they are queued, until a None: gRPC reads this iterator on a
    thread of its own, which the None ends."""
    while (request := requests.get()) is not None:
        yield request


def dumps(obj: Any) -> str:
    """JSON as stored: compact, keys sorted, so `etcdctl get` output is stable."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


class Store:
    """A connection to one etcd cluster (one or several endpoints, with failover).

    Every call retries transient failures for at most `retry_seconds`; after that it raises
    `StoreUnavailableError` naming the endpoints and what to check.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        timeout: float = 3.0,
        retry_seconds: float = 10.0,
        auth: EtcdAuth | None = None,
    ) -> None:
        self.addresses: list[EndpointAddress] = parse_endpoints(
            endpoints if isinstance(endpoints, str) else list(endpoints)
        )
        self.timeout = timeout
        self.retry_seconds = retry_seconds
        self.auth = auth or EtcdAuth()
        self.auth.check(self.addresses)  # a password over http is refused here, before anything is sent
        self._client: pyetcd.MultiEndpointEtcd3Client | None = None
        self._streams_lock = threading.Lock()
        self._watch_hub: WatchHub | None = None
        self._keep_alives: KeepAliveStream | None = None
        # When a call last met etcd unreachable (monotonic), even if a retry then got through: how an
        # agent tells an outage it lived through from a member lost while etcd was up (docs/design.md §3.11).
        self.last_unreachable: float | None = None

    # --- connection ---

    @property
    def endpoints_text(self) -> str:
        return ",".join(a.url for a in self.addresses)

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

    @property
    def watch_hub(self) -> WatchHub:
        """The one Watch stream that every watch of this connection rides (elastic.store.watch)."""
        with self._streams_lock:
            if self._watch_hub is None:
                from elastic.store.watch import WatchHub

                self._watch_hub = WatchHub(self)
            return self._watch_hub

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

    def close(self) -> None:
        with self._streams_lock:
            streams, self._watch_hub, self._keep_alives = (self._watch_hub, self._keep_alives), None, None
        for stream in streams:
            if stream is not None:
                stream.close()
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one etcd call, retrying transient failures within the bound.

        The first attempt runs before any retry machinery is built: a tenacity `Retrying` per call was a third
        of a read's CPU in this process (0.17 of 0.5 ms), and nearly every call succeeds at once.
        """
        started = time.monotonic()
        try:
            return self._attempt(fn, *args, **kwargs)
        except TRANSIENT_ERRORS:
            pass  # retried below, within what is left of the bound
        except grpc.RpcError as err:  # auth, permission, bad request: not worth a retry
            raise self.refused(what, err) from None
        try:
            for attempt in Retrying(
                stop=stop_after_delay(max(self.retry_seconds - (time.monotonic() - started), 0.0)),
                wait=wait_exponential(multiplier=0.05, max=1.0),
                retry=retry_if_exception_type(TRANSIENT_ERRORS),
                reraise=True,
            ):
                with attempt:
                    return self._attempt(fn, *args, **kwargs)
        except TRANSIENT_ERRORS as err:
            raise self.unavailable(what, err) from None
        except grpc.RpcError as err:
            raise self.refused(what, err) from None
        raise AssertionError("unreachable")  # pragma: no cover - Retrying either returns or raises

    def _attempt(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """One try of a call: a TLS failure is final (it never heals by retrying); any other transient failure
        is noted, as etcd unreachable (see `last_unreachable`), and raised for the caller to retry."""
        try:
            return fn(*args, **kwargs)
        except TRANSIENT_ERRORS as err:
            tls_problem = _tls_failure(err)
            if tls_problem:
                raise StoreAccessError(f"etcd at {self.endpoints_text}: TLS failed: {tls_problem}") from None
            self.last_unreachable = time.monotonic()
            raise

    def refused(self, what: str, err: grpc.RpcError) -> StoreUnavailableError:
        details = _rpc_details(err)
        if err.code() == grpc.StatusCode.PERMISSION_DENIED:
            who = f"etcd user {self.auth.user!r}" if self.auth.user else "this client"
            return StoreAccessError(
                f"etcd at {self.endpoints_text} refused {what}: {details}: {who} has no role granting that "
                "key (a per-job role covers /elastic/jobs/<namespace>/<job>/ only; see README 'TLS and auth')"
            )
        if err.code() == grpc.StatusCode.NOT_FOUND and "lease not found" in details:
            return LeaseLostError(f"etcd at {self.endpoints_text} refused {what}: {details}")
        if err.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INVALID_ARGUMENT) and self.auth.user:
            return StoreAccessError(f"etcd at {self.endpoints_text} refused {what}: {details} "
                                    "(check --etcd-user / $ELASTIC_ETCD_PASSWORD)")
        return StoreUnavailableError(f"etcd at {self.endpoints_text} refused {what}: {details}")

    def unavailable(self, what: str, err: BaseException) -> StoreUnavailableError:
        return StoreUnavailableError(
            f"etcd at {self.endpoints_text} did not answer {what} within {self.retry_seconds:g} s "
            f"(last error: {describe_error(err)}). Check that etcd is running and reachable at that "
            "address, or pass the right endpoint (--etcd / --rdzv-endpoint)."
        )

    # --- key/value ---

    def get(self, key: str) -> Entry | None:
        response = self._call(f"get {key}", lambda: self.client.get_response(key))
        return _entry(response.kvs[0]) if response.kvs else None

    def get_json(self, key: str, default: Any = None) -> Any:
        """A raw JSON value, for tests and tools that show what etcd holds. The project's own reads decode
        through `elastic.codec`, which turns a bad value into an error naming the key."""
        entry = self.get(key)
        return json.loads(entry.value) if entry else default

    def get_prefix(self, prefix: str) -> tuple[list[Entry], int]:
        """All keys under a prefix, sorted by key, and the store revision they were read at."""
        response = self._call(
            f"get --prefix {prefix}",
            lambda: self.client.get_prefix_response(prefix, sort_order="ascend", sort_target="key"),
        )
        return [_entry(kv) for kv in response.kvs], response.header.revision

    def get_ranges(self, ranges: Sequence[tuple[str, str]]) -> tuple[list[Entry], int]:
        """The keys in each [start, end) range (each in key order), all read at one revision: one read-only
        transaction, one request however many ranges."""

        def run() -> Any:
            client = self.client
            reads = [pyetcd.transactions.Get(start, end) for start, end in ranges]
            return self._send_txn(pyetcd.etcdrpc.TxnRequest(success=client._ops_to_requests(reads)))

        response = self._call("get " + ", ".join(f"{start}..{end}" for start, end in ranges), run)
        entries = [_entry(kv) for answer in response.responses for kv in answer.response_range.kvs]
        return entries, response.header.revision

    def put(self, key: str, value: bytes | str, lease: int | None = None) -> int:
        """Write `key`; returns the revision of the write."""
        response = self._call(f"put {key}", lambda: self.client.put(key, value, lease=lease))
        return int(response.header.revision)

    def put_json(self, key: str, obj: Any, lease: int | None = None) -> int:
        return self.put(key, dumps(obj), lease)

    def delete(self, key: str) -> bool:
        return bool(self._call(f"delete {key}", lambda: self.client.delete(key)))

    def delete_prefix(self, prefix: str) -> int:
        response = self._call(f"delete --prefix {prefix}", lambda: self.client.delete_prefix(prefix))
        return int(response.deleted)

    def revision(self) -> int:
        """The cluster's current revision (a watch started at revision+1 misses nothing after now)."""
        return self.get_prefix("\0")[1]

    def txn(self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()) -> TxnResult:
        """One atomic transaction: if every comparison holds, apply `success`, else `failure`.

        A retried transaction is safe: its comparisons fail the second time if the first try landed.
        """

        def run() -> TxnResult:
            client = self.client
            response = self._send_txn(pyetcd.etcdrpc.TxnRequest(
                compare=[_compare(c).build_message() for c in compare],
                success=client._ops_to_requests([_op(o) for o in success]),
                failure=client._ops_to_requests([_op(o) for o in failure]),
            ))
            return TxnResult(response.succeeded, response.header.revision)

        touched = [getattr(c, "key", None) or getattr(c, "prefix", "") for c in compare]
        touched += [o.key for o in (*success, *failure)]
        # Named by what it touches, so that a refusal (permission denied) says which keys.
        return self._call(f"transaction on {os.path.commonpath(touched) if touched else '?'}", run)

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
        """A new lease of `ttl` seconds; returns its id."""
        return int(self._call(f"lease grant {ttl}", lambda: self.client.lease(ttl)).id)

    def refresh_once(self, lease_id: int) -> int:
        """Send one keep-alive; returns the lease's new TTL, 0 if the lease no longer exists.

        No retry here: the keep-alive loop decides how long a hiccup may last.
        """
        return self.keep_alives.refresh(lease_id, self.timeout)

    def revoke(self, lease_id: int) -> None:
        """Revoke a lease (its keys go at once). Revoking a lease that is already gone is fine."""

        def run() -> None:
            try:
                self.client.revoke_lease(lease_id)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.NOT_FOUND:
                    raise

        self._call(f"lease revoke {lease_id:x}", run)

    def lease_ttl(self, lease_id: int) -> int:
        """Remaining TTL of a lease; -1 when it no longer exists."""
        return int(self._call("lease timetolive", lambda: self.client.get_lease_info(lease_id)).TTL)


def _entry(kv: Any) -> Entry:
    return Entry(kv.key.decode(), bytes(kv.value), kv.mod_revision, kv.create_revision, kv.lease)


def _compare(c: Compare) -> etcd_txn.BaseCompare:
    if isinstance(c, ModRevisionIs):
        return etcd_txn.Mod(c.key) == c.revision
    if isinstance(c, UnchangedSince):
        return etcd_txn.Mod(c.prefix, range_end=pyetcd.utils.prefix_range_end(c.prefix.encode())) < c.revision + 1
    return etcd_txn.Value(c.key) == c.value


def _op(o: Op) -> Any:
    if isinstance(o, Put):
        return etcd_txn.Put(o.key, o.value, lease=o.lease)
    if o.prefix:
        return etcd_txn.Delete(o.key, range_end=pyetcd.utils.prefix_range_end(o.key.encode()))
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
