"""The Lease API in memory, with simulated time: for simulations too many steps long to drive over HTTP.

It keeps the rules that make leader election safe, the same as tests/kubernetes/fake_api.py (and the
real API server): one increasing resourceVersion; create of an existing object and replace with a stale
resourceVersion answer 409 Conflict. `test_kube_leader.py` runs one script against both to show they
agree. On top, each call can be given latency (simulated time passes before and after it takes effect)
and a fault: refused before it takes effect, its answer lost after it took effect, or (for a read) an
older version answered, as a read that was sent before some other replica's write would see.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from elastic.controller.machinery.lease_election import LeaseConflict, LeaseUnavailable


class SimTime:
    """The one true time of a simulation; each replica reads it through its own skewed clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self, offset: float = 0.0, rate: float = 1.0) -> Callable[[], float]:
        """A clock that reads `offset + rate * now`: another host's monotonic clock (or wall clock)."""
        return lambda: offset + rate * self.now

    def sleep(self, seconds: float) -> None:
        """A call in flight for `seconds`: here time just moves on (a scheduler lets others run meanwhile)."""
        self.now += seconds


class Fault(str, Enum):
    NONE = "none"
    REFUSED = "refused"  # 503 before it took effect
    REPLY_LOST = "reply-lost"  # took effect, then the answer was lost (timeout)
    STALE = "stale"  # a read answers an older version (a write only takes REFUSED/REPLY_LOST)


@dataclass(frozen=True)
class Call:
    """What happens to one call: simulated seconds before it takes effect and after, and its fault."""

    before: float = 0.0
    after: float = 0.0
    fault: Fault = Fault.NONE


@dataclass
class MemoryLeases:
    """`LeaseApi` over a dict; `plan` says what happens to each call (default: nothing, instantly)."""

    time: SimTime
    plan: Callable[[str], Call] = lambda verb: Call()
    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    history: dict[tuple[str, str], list[dict[str, Any] | None]] = field(default_factory=dict)
    revision: int = 0

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        call = self._begin("get")
        versions = self.history.get((namespace, name), [None])
        if call.fault is Fault.STALE:
            found = versions[max(0, len(versions) - 2)]  # the version before the latest (or none)
        else:
            found = self.objects.get((namespace, name))
        self._end(call)
        return copy.deepcopy(found)

    def create(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        call = self._begin("create")
        key = (namespace, body["metadata"]["name"])
        if key in self.objects:
            raise LeaseConflict(f'leases "{key[1]}" already exists')
        return self._store(key, body, call)

    def replace(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        call = self._begin("replace")
        current = self.objects.get((namespace, name))
        if current is None:
            raise LeaseUnavailable(f'404 leases "{name}" not found')
        sent = body["metadata"].get("resourceVersion")
        if sent and sent != current["metadata"]["resourceVersion"]:
            raise LeaseConflict("the object has been modified; please apply your changes to the latest version")
        return self._store((namespace, name), body, call)

    def _begin(self, verb: str) -> Call:
        call = self.plan(verb)
        self.time.sleep(call.before)
        if call.fault is Fault.REFUSED:
            raise LeaseUnavailable(f"503 {verb} refused (simulated)")
        return call

    def _store(self, key: tuple[str, str], body: dict[str, Any], call: Call) -> dict[str, Any]:
        self.revision += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self.revision)
        self.objects[key] = stored
        self.history.setdefault(key, [None]).append(copy.deepcopy(stored))
        self._end(call)
        return copy.deepcopy(stored)

    def _end(self, call: Call) -> None:
        self.time.sleep(call.after)
        if call.fault is Fault.REPLY_LOST:
            raise LeaseUnavailable("timed out waiting for the answer (simulated)")
