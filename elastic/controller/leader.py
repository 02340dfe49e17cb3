"""Leader election with a coordination.k8s.io/v1 Lease, so that two controller replicas are safe.

One Lease named `elastic-controller` in the controller's namespace. The holder renews `renewTime` every
step; another replica takes the lease over once `renewTime + leaseDurationSeconds` has passed. Every write
is a create or a replace carrying the resourceVersion that was read: when two replicas race, the API
server accepts one and answers 409 Conflict to the other, which then is not the leader.

`decide(record, me, now)` is the pure decision; `LeaderElector` does the reads and writes. As in
client-go, expiry compares the holder's renewTime to this replica's clock, so clocks are assumed to be
roughly in sync (seconds, far below the lease duration).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from typing import Any

from kubernetes.client import ApiException, CoordinationV1Api, V1Lease

log = logging.getLogger(__name__)

LEASE_NAME = "elastic-controller"


class Decision(str, Enum):
    CREATE = "create"  # no lease yet
    ACQUIRE = "acquire"  # free or expired: take it over
    RENEW = "renew"  # mine: renew it
    WAIT = "wait"  # someone else holds it and it has not expired


@dataclass(frozen=True)
class LeaseRecord:
    holder: str | None
    duration: int
    renew_time: float | None
    acquire_time: float | None = None
    transitions: int = 0
    resource_version: str | None = None


def decide(record: LeaseRecord | None, me: str, now: float) -> Decision:
    if record is None:
        return Decision.CREATE
    if record.holder == me:
        return Decision.RENEW
    if not record.holder or record.renew_time is None or record.renew_time + record.duration <= now:
        return Decision.ACQUIRE
    return Decision.WAIT


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _micro_time(seconds: float) -> datetime:
    moment = datetime.fromtimestamp(seconds, timezone.utc)
    # The client writes datetime.isoformat(), which drops a zero fraction; a MicroTime needs one.
    return moment if moment.microsecond else moment.replace(microsecond=1)


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


class LeaderElector:
    def __init__(
        self, api: CoordinationV1Api, namespace: str, identity: str, lease_seconds: int = 15, name: str = LEASE_NAME
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.name = name
        self.is_leader = False
        self._renewed_at = 0.0  # monotonic time of our last successful renewal
        self.renew_deadline = lease_seconds * 2 / 3

    def read(self) -> LeaseRecord | None:
        try:
            response = self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return parse_lease(json.loads(response.data))

    def _body(self, record: LeaseRecord | None, now: float, acquiring: bool) -> V1Lease:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if record is not None and record.resource_version:
            metadata["resourceVersion"] = record.resource_version
        transitions = record.transitions if record else 0
        acquired = record.acquire_time if record and record.acquire_time else now
        if acquiring:
            transitions, acquired = (transitions + 1 if record is not None else 0), now
        return V1Lease.from_dict(
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": metadata,
                "spec": {
                    "holderIdentity": self.identity,
                    "leaseDurationSeconds": self.lease_seconds,
                    "acquireTime": _micro_time(acquired),
                    "renewTime": _micro_time(now),
                    "leaseTransitions": transitions,
                },
            }
        )

    def try_acquire_or_renew(self) -> bool:
        """One election step: True while this replica holds the lease."""
        try:
            leading = self._step()
        except ApiException as err:
            if err.status != 409:
                log.warning("leader election: %s", err.reason)
            leading = False
        except OSError as err:  # API server unreachable
            log.warning("leader election: %s", err)
            leading = False
        if not leading and self.is_leader and time.monotonic() - self._renewed_at < self.renew_deadline:
            # A failed renewal is not yet a lost lease: nobody else can take it before it expires, and this
            # replica gives it up (renewDeadline, as in client-go) well before that.
            return True
        if leading:
            self._renewed_at = time.monotonic()
        if leading != self.is_leader:
            log.info(
                "%s %s leadership of %s/%s", self.identity, "took" if leading else "lost", self.namespace, self.name
            )
        self.is_leader = leading
        return leading

    def _step(self) -> bool:
        record = self.read()
        now = time.time()
        decision = decide(record, self.identity, now)
        if decision is Decision.WAIT:
            return False
        body = self._body(record, now, acquiring=decision is not Decision.RENEW)
        if decision is Decision.CREATE:
            self.api.create_namespaced_lease(self.namespace, body, _preload_content=False)
        else:
            self.api.replace_namespaced_lease(self.name, self.namespace, body, _preload_content=False)
        return True

    def release(self) -> None:
        """Give the lease up on a clean shutdown, so that another replica need not wait for it to expire."""
        if not self.is_leader:
            return
        record = self.read()
        if record is not None and record.holder == self.identity:
            body = self._body(record, time.time(), acquiring=False)
            body.spec.holder_identity = ""  # type: ignore[union-attr]
            body.spec.lease_duration_seconds = 1  # type: ignore[union-attr]
            try:
                self.api.replace_namespaced_lease(self.name, self.namespace, body, _preload_content=False)
            except ApiException as err:
                log.warning("leader election: release: %s", err.reason)
        self.is_leader = False
