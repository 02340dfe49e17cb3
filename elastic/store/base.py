"""What every etcd connection does the same whatever its wire: endpoints and credentials checked before
anything is sent, calls retried within one bound, and one readable error when etcd is really gone.

Two wires derive from it: `client.Store` (gRPC, with one multiplexed watch stream and one keep-alive stream
per connection: controllers, the CLI, the scale benchmark) and `gateway.GatewayStore` (etcd's HTTP/JSON
gateway over plain sockets: agents and training processes, which fork or run inside programs that fork, and so
must hold no gRPC; docs/design.md §3.21).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from elastic.errors import LeaseLostError, StoreUnavailableError, StoreUnreachableError
from elastic.store.auth import EtcdAuth, StoreAccessError
from elastic.store.endpoints import EndpointAddress, parse_endpoints
from elastic.store.ops import Compare, Entry, Op, TxnResult, dumps

if TYPE_CHECKING:
    from elastic.store.watch import WatchHubLike

T = TypeVar("T")


class StoreBase:
    """A connection to one etcd cluster (one or several endpoints, with failover).

    Every call retries transient failures for at most `retry_seconds`; after that it raises
    `StoreUnavailableError` naming the endpoints and what to check. A subclass names its wire's transient
    and refusal errors, sends the calls, and says what a refusal means.
    """

    # Errors after which the same call may succeed on the next try (or on the next endpoint).
    transient_errors: tuple[type[BaseException], ...] = ()
    # Errors that are etcd's (or the wire's) final answer to this call: mapped by `refused`, never retried.
    refusal_errors: tuple[type[BaseException], ...] = ()

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
        self._streams_lock = threading.Lock()
        self._watch_hub: WatchHubLike | None = None
        # When a call last met etcd unreachable (monotonic), even if a retry then got through: how an
        # agent tells an outage it lived through from a member lost while etcd was up (docs/design.md §3.11).
        self.last_unreachable: float | None = None
        self._setup()

    def _setup(self) -> None:
        """The wire's own connection state (nothing is sent yet)."""

    @property
    def endpoints_text(self) -> str:
        return ",".join(a.url for a in self.addresses)

    @property
    def watch_hub(self) -> WatchHubLike:
        """What carries every watch of this connection (elastic.store.watch.PrefixWatch registers with it)."""
        with self._streams_lock:
            if self._watch_hub is None:
                self._watch_hub = self._new_watch_hub()
            return self._watch_hub

    def _new_watch_hub(self) -> WatchHubLike:
        raise NotImplementedError

    def _close_streams(self) -> list[Any]:
        """Forget this connection's streams and return them, to be closed outside the lock."""
        with self._streams_lock:
            hub, self._watch_hub = self._watch_hub, None
        return [hub]

    def __enter__(self) -> StoreBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError

    # --- one call, retried within the bound ---

    def _call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one etcd call, retrying transient failures within the bound.

        The first attempt runs before any retry machinery is built: a tenacity `Retrying` per call was a third
        of a read's CPU in this process (0.17 of 0.5 ms), and nearly every call succeeds at once.
        """
        started = time.monotonic()
        try:
            return self._attempt(fn, *args, **kwargs)
        except self.transient_errors:
            pass  # retried below, within what is left of the bound
        except self.refusal_errors as err:  # auth, permission, bad request: not worth a retry
            raise self.refused(what, err) from None
        try:
            for attempt in Retrying(
                stop=stop_after_delay(max(self.retry_seconds - (time.monotonic() - started), 0.0)),
                wait=wait_exponential(multiplier=0.05, max=1.0),
                retry=retry_if_exception_type(self.transient_errors),
                reraise=True,
            ):
                with attempt:
                    return self._attempt(fn, *args, **kwargs)
        except self.transient_errors as err:
            raise self.unavailable(what, err) from None
        except self.refusal_errors as err:
            raise self.refused(what, err) from None
        raise AssertionError("unreachable")  # pragma: no cover - Retrying either returns or raises

    def _attempt(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """One try of a call: a TLS failure is final (it never heals by retrying); any other transient failure
        is noted, as etcd unreachable (see `last_unreachable`), and raised for the caller to retry."""
        try:
            return fn(*args, **kwargs)
        except self.transient_errors as err:
            tls_problem = self.tls_failure(err)
            if tls_problem:
                raise StoreAccessError(f"etcd at {self.endpoints_text}: TLS failed: {tls_problem}") from None
            self.last_unreachable = time.monotonic()
            raise

    def tls_failure(self, err: BaseException) -> str | None:
        """Why a connection failed, if TLS was the cause: a wrong CA or a missing client certificate never
        heals by retrying."""
        return None

    def refused(self, what: str, err: BaseException) -> StoreUnavailableError:
        """One of `refusal_errors` as the error a user reads (the wire says which status it carries)."""
        raise NotImplementedError

    def refusal(self, what: str, status: str, details: str) -> StoreUnavailableError:
        """etcd's final answer to a call, by its gRPC status name (whichever wire carried it): who was refused
        what, and what to check."""
        if status == "PERMISSION_DENIED":
            who = f"etcd user {self.auth.user!r}" if self.auth.user else "this client"
            return StoreAccessError(
                f"etcd at {self.endpoints_text} refused {what}: {details}: {who} has no role granting that "
                "key (a per-job role covers /elastic/jobs/<namespace>/<job>/ only; see README 'TLS and auth')"
            )
        if status == "NOT_FOUND" and "lease not found" in details:
            return LeaseLostError(f"etcd at {self.endpoints_text} refused {what}: {details}")
        if status in ("UNAUTHENTICATED", "INVALID_ARGUMENT") and self.auth.user:
            return StoreAccessError(f"etcd at {self.endpoints_text} refused {what}: {details} "
                                    "(check --etcd-user / $ELASTIC_ETCD_PASSWORD)")
        return StoreUnavailableError(f"etcd at {self.endpoints_text} refused {what}: {details}")

    def describe_error(self, err: BaseException) -> str:
        return str(err) or type(err).__name__

    def unavailable(self, what: str, err: BaseException) -> StoreUnreachableError:
        return StoreUnreachableError(
            f"etcd at {self.endpoints_text} did not answer {what} within {self.retry_seconds:g} s "
            f"(last error: {self.describe_error(err)}). Check that etcd is running and reachable at that "
            "address, or pass the right endpoint (--etcd / --rdzv-endpoint)."
        )

    # --- the calls every wire offers ---

    def get(self, key: str) -> Entry | None:
        raise NotImplementedError

    def get_prefix(self, prefix: str) -> tuple[list[Entry], int]:
        """All keys under a prefix, sorted by key, and the store revision they were read at."""
        raise NotImplementedError

    def get_ranges(self, ranges: Sequence[tuple[str, str]]) -> tuple[list[Entry], int]:
        """The keys in each [start, end) range (each in key order), all read at one revision: one read-only
        transaction, one request however many ranges."""
        raise NotImplementedError

    def put(self, key: str, value: bytes | str, lease: int | None = None) -> int:
        """Write `key`; returns the revision of the write."""
        raise NotImplementedError

    def delete(self, key: str) -> bool:
        raise NotImplementedError

    def delete_prefix(self, prefix: str) -> int:
        raise NotImplementedError

    def txn(self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()) -> TxnResult:
        """One atomic transaction: if every comparison holds, apply `success`, else `failure`.

        A retried transaction is safe: its comparisons fail the second time if the first try landed.
        """
        raise NotImplementedError

    def grant(self, ttl: int) -> int:
        """A new lease of `ttl` seconds; returns its id."""
        raise NotImplementedError

    def refresh_once(self, lease_id: int) -> int:
        """Send one keep-alive; returns the lease's new TTL, 0 if the lease no longer exists.

        No retry here: the keep-alive loop decides how long a hiccup may last.
        """
        raise NotImplementedError

    def revoke(self, lease_id: int) -> None:
        """Revoke a lease (its keys go at once). Revoking a lease that is already gone is fine."""
        raise NotImplementedError

    def lease_ttl(self, lease_id: int) -> int:
        """Remaining TTL of a lease; -1 when it no longer exists."""
        raise NotImplementedError

    # --- built on the calls ---

    def get_json(self, key: str, default: Any = None) -> Any:
        """A raw JSON value, for tests and tools that show what etcd holds. The project's own reads decode
        through `elastic.codec`, which turns a bad value into an error naming the key."""
        entry = self.get(key)
        return json.loads(entry.value) if entry else default

    def put_json(self, key: str, obj: Any, lease: int | None = None) -> int:
        return self.put(key, dumps(obj), lease)

    def revision(self) -> int:
        """The cluster's current revision (a watch started at revision+1 misses nothing after now)."""
        return self.get_prefix("\0")[1]
