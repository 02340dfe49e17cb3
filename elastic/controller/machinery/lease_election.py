"""Leader election with a coordination.k8s.io/v1 Lease, with client-go's semantics: leaders never overlap.

One Lease named `elastic-controller` in the controller's namespace. Every write is a create or a replace
carrying the resourceVersion that was read: when two replicas race, the API server accepts one and answers
409 Conflict to the other.

Expiry is judged by *locally observed* time, as client-go's `leaderelection` does, never by the holder's
timestamps: a replica records on its own monotonic clock when it first saw the current version of the
record (`Observed.at`), and takes the lease over only once `leaseDurationSeconds` passed on that clock with
no new version. renewTime/acquireTime are written for people (`kubectl get lease -o yaml`) and never read
as times, so a holder whose wall clock is hours off changes nothing.

Acting ("I lead") is bounded on the holder's own monotonic clock: it ends `renew_deadline` after the *start*
of the last successful write. That write landed no earlier than its start, every other replica saw it no
earlier than it landed, and each waits `leaseDurationSeconds` from then; so with renew_deadline < lease
(2/3 of it) the holder has stopped before anyone else can start, with a third of the lease to spare for
clocks running at slightly different rates. Acting stops at once, before anything else, when a write is
refused with 409 (someone else wrote the Lease) or a read shows another holder; an API server that does
not answer keeps the holder acting only until that deadline (nobody can take an unexpired lease).

Renewal runs on its own thread every `retry_period` (lease/5), so a slow controller step never lets the
lease lapse, and a stalled step does not hold leadership either: the deadline is read off the clock when
the step asks. On the loss of leadership, `on_stopped_leading` is called; the controller process exits
there, as client-go's OnStoppedLeading callers do (a deposed process must not go on acting on stale
state; a fresh one follows). Exiting is the callback's business: the elector itself goes on as a follower
(tests observe the callback and the `lost` event). Its writes to etcd are fenced besides (kube_leadership.py).

Pure decisions: `observe` (when did I first see this version), `decide` (create, acquire, renew or wait),
`acting_until` (how long an attempt lets me act). `LeaderElector` does the reads and writes through a
`LeaseApi` (`KubernetesLeases` for the real client; tests drive the same elector against an in-memory
model of the API with an injected clock).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from typing import Any, Protocol

from kubernetes.client import ApiException, CoordinationV1Api

from elastic.cluster.kubernetes import TRANSPORT_ERRORS

log = logging.getLogger(__name__)

LEASE_NAME = "elastic-controller"


class LeaseConflict(Exception):
    """409: the Lease changed since it was read (or was created meanwhile): someone else wrote it."""


class LeaseUnavailable(Exception):
    """The API server did not answer, or answered an error: nothing is known about the Lease."""


class LeaseApi(Protocol):
    """The three Lease calls an elector makes; objects are plain dicts as the API server returns them."""

    def get(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def create(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]: ...

    def replace(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]: ...


class KubernetesLeases:
    """`LeaseApi` over the `kubernetes` client: 409 is a `LeaseConflict`, any other failure `LeaseUnavailable`.

    Each call is bounded by `timeout`, so a hung connection cannot keep the renew thread from its next try.
    """

    def __init__(self, api: CoordinationV1Api, timeout: float) -> None:
        self.api = api
        self.timeout = timeout

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call(self.api.read_namespaced_lease, name, namespace)
        except LeaseUnavailable as err:
            if isinstance(err.__cause__, ApiException) and err.__cause__.status == 404:
                return None
            raise

    def create(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(self.api.create_namespaced_lease, namespace, body)

    def replace(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(self.api.replace_namespaced_lease, name, namespace, body)

    def _call(self, method: Callable[..., Any], *args: Any) -> dict[str, Any]:
        try:
            response = method(*args, _preload_content=False, _request_timeout=self.timeout)
        except ApiException as err:
            if err.status == 409:
                raise LeaseConflict(err.reason) from err
            raise LeaseUnavailable(f"{err.status} {err.reason}") from err
        except TRANSPORT_ERRORS as err:  # unreachable, reset, timed out
            raise LeaseUnavailable(str(err)) from err
        return json.loads(response.data)


class Decision(str, Enum):
    CREATE = "create"  # no lease yet
    ACQUIRE = "acquire"  # free, or unchanged for a whole lease duration on my clock: take it over
    RENEW = "renew"  # mine: renew it
    WAIT = "wait"  # someone else holds it and I saw it change less than a lease duration ago


class Outcome(str, Enum):
    """What one attempt (read, decide, write) found out."""

    HELD = "held"  # my write went through: I hold the lease
    CONFLICT = "conflict"  # 409: someone else wrote the lease between my read and my write
    FOREIGN = "foreign"  # the lease is someone else's and has not expired
    UNKNOWN = "unknown"  # the API server did not answer (or my write's answer was lost)


@dataclass(frozen=True)
class LeaseRecord:
    """The Lease as read. Two reads are the same version when they are equal (resourceVersion included)."""

    holder: str | None
    duration: int
    renew_time: float | None  # the holder's wall clock: for people, never compared
    acquire_time: float | None = None
    transitions: int = 0
    resource_version: str | None = None


@dataclass(frozen=True)
class Observed:
    """A version of the record and when *this* replica first saw it, on its own monotonic clock."""

    record: LeaseRecord
    at: float


def observe(previous: Observed | None, record: LeaseRecord | None, now: float) -> Observed | None:
    """The observation after reading `record` at `now`: a version already seen keeps its first sighting."""
    if record is None:
        return None
    if previous is not None and previous.record == record:
        return previous
    return Observed(record, now)


def decide(observed: Observed | None, me: str, now: float) -> Decision:
    """client-go's tryAcquireOrRenew decision; `now` and `observed.at` are both this replica's clock."""
    if observed is None:
        return Decision.CREATE
    record = observed.record
    if record.holder == me:
        return Decision.RENEW
    if not record.holder or observed.at + record.duration <= now:
        return Decision.ACQUIRE
    return Decision.WAIT


def acting_until(outcome: Outcome, until: float | None, started: float, renew_deadline: float) -> float | None:
    """Until when (my clock) I may act after an attempt that started at `started`; None: not at all.

    A success counts from the attempt's start, the earliest the write can have landed. Not knowing keeps
    the bound of the last success: time alone ends it.
    """
    if outcome is Outcome.HELD:
        return started + renew_deadline
    if outcome is Outcome.UNKNOWN:
        return until
    return None


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def micro_time(seconds: float) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_lease(obj: dict[str, Any]) -> LeaseRecord:
    spec = obj.get("spec") or {}
    return LeaseRecord(
        holder=spec.get("holderIdentity"),
        duration=int(spec.get("leaseDurationSeconds") or 0),
        renew_time=_parse_time(spec.get("renewTime")),
        acquire_time=_parse_time(spec.get("acquireTime")),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=(obj.get("metadata") or {}).get("resourceVersion"),
    )


def lease_body(
    namespace: str, name: str, holder: str, duration: int, current: LeaseRecord | None, acquiring: bool, wall: float
) -> dict[str, Any]:
    """The Lease to write over `current` (None: to create). Taking it over counts a transition."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if current is not None and current.resource_version:
        metadata["resourceVersion"] = current.resource_version
    transitions = current.transitions if current else 0
    acquired = current.acquire_time if current and current.acquire_time else wall
    if acquiring:
        transitions, acquired = (transitions + 1 if current is not None else 0), wall
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration,
            "acquireTime": micro_time(acquired),
            "renewTime": micro_time(wall),
            "leaseTransitions": transitions,
        },
    }


class LeaderElector:
    """One replica's part in the election: `start()` the renew thread, ask `acting` before each action.

    `step()` is one pass of the renew thread; tests call it directly with an injected `clock` (monotonic:
    expiry and acting) and `wall` (only written into renewTime/acquireTime).
    """

    def __init__(
        self,
        api: LeaseApi,
        namespace: str,
        identity: str,
        lease_seconds: int = 15,
        name: str = LEASE_NAME,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        on_started_leading: Callable[[], None] | None = None,
        on_stopped_leading: Callable[[str], None] | None = None,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.name = name
        self.retry_period = lease_seconds / 5
        self.renew_deadline = lease_seconds * 2 / 3
        self._clock = clock
        self._wall = wall
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self._observed: Observed | None = None
        self._until: float | None = None  # my clock: acting ends here (None: not acting)
        self._leading = False  # what the callbacks were last told
        self.lost = threading.Event()  # set on every loss of leadership (for whoever waits on it)
        self.lost_reason = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def acting(self) -> bool:
        """True while this replica may act: it holds the lease and its renew deadline has not passed."""
        until = self._until
        return until is not None and self._clock() < until

    def read(self) -> LeaseRecord | None:
        obj = self.api.get(self.namespace, self.name)
        return parse_lease(obj) if obj is not None else None

    def step(self) -> bool:
        """One renewal pass: read, decide, write; then tell the callbacks of a change. True while acting."""
        started = self._clock()
        outcome = self._attempt()
        if outcome is Outcome.CONFLICT:
            self._stop_acting(f"another replica wrote {self.namespace}/{self.name} first (409 Conflict)")
        self._until = acting_until(outcome, self._until, started, self.renew_deadline)
        acting = self.acting
        if acting and not self._leading:
            self._leading = True
            self.lost.clear()
            log.info("%s took leadership of %s/%s", self.identity, self.namespace, self.name)
            if self.on_started_leading is not None:
                self.on_started_leading()
        elif not acting:
            self._stop_acting(f"{self.namespace}/{self.name} not renewed within {self.renew_deadline:.1f} s")
        return acting

    def _attempt(self) -> Outcome:
        try:
            record = self.read()
        except LeaseUnavailable as err:
            log.warning("leader election: reading %s/%s: %s", self.namespace, self.name, err)
            return Outcome.UNKNOWN
        self._observed = observe(self._observed, record, self._clock())
        if record is not None and record.holder != self.identity and self._leading:
            # Someone else wrote the lease: stop before deciding anything else (even re-acquiring).
            self._stop_acting(f"{self.namespace}/{self.name} is now held by {record.holder or 'nobody'}")
        decision = decide(self._observed, self.identity, self._clock())
        if decision is Decision.WAIT:
            return Outcome.FOREIGN
        body = lease_body(
            self.namespace, self.name, self.identity, self.lease_seconds, record, decision is not Decision.RENEW,
            self._wall(),
        )  # fmt: skip
        try:
            if decision is Decision.CREATE:
                written = self.api.create(self.namespace, body)
            else:
                written = self.api.replace(self.namespace, self.name, body)
        except LeaseConflict:
            return Outcome.CONFLICT
        except LeaseUnavailable as err:
            log.warning("leader election: writing %s/%s: %s", self.namespace, self.name, err)
            return Outcome.UNKNOWN
        self._observed = Observed(parse_lease(written), self._clock())
        return Outcome.HELD

    def _stop_acting(self, why: str) -> None:
        """Not acting from now on; the first time after leading, tell `on_stopped_leading` why."""
        self._until = None
        if not self._leading:
            return
        self._leading = False
        self.lost_reason = why
        self.lost.set()
        log.warning("%s lost leadership: %s", self.identity, why)
        if self.on_stopped_leading is not None:
            self.on_stopped_leading(why)

    # --- the renew thread ---

    def start(self) -> LeaderElector:
        """Renew (or try to acquire) every `retry_period` on a thread of its own, until `stop()`."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"lease-{self.identity}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # never let the renew thread die silently: acting then ends by the clock
                log.exception("leader election step failed")
            self._stop.wait(self.retry_period)

    def stop(self) -> None:
        """Stop renewing (the lease lapses unless `release()`d); acting ends by its deadline."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.retry_period + 5)

    def release(self) -> None:
        """Give the lease up on a clean shutdown, so that another replica need not wait for it to expire.

        The renew thread is stopped first (it would take the lease back). Acting ends before the write; a
        voluntary release is not a loss, so `on_stopped_leading` is not called.
        """
        self.stop()
        was_leading, self._leading, self._until = self._leading, False, None
        if not was_leading:
            return
        try:
            record = self.read()
            if record is not None and record.holder == self.identity:
                body = lease_body(self.namespace, self.name, "", 1, record, False, self._wall())
                self.api.replace(self.namespace, self.name, body)
        except (LeaseConflict, LeaseUnavailable) as err:  # then it expires by itself
            log.warning("leader election: release: %s", err)
