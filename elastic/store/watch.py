"""Prefix watches that resume where they left off, whatever wire carries them.

etcd's watch stream dies with the connection (an etcd restart, a failover). A watch here reconnects and asks
for events from the revision after the last one it delivered, so a consumer sees every event exactly once
and in order, across any number of disconnects; only compaction of the needed revisions ends it.

A `PrefixWatch` is the consumer's side (a queue of events); its connection's hub carries it: the gRPC
`Store`'s one multiplexed stream (`watch_stream.WatchHub`), or a `GatewayStore`'s HTTP stream per watch
(`gateway`). Nothing here imports gRPC.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from elastic.errors import WatchCompactedError
from elastic.store.ops import prefix_range_end

if TYPE_CHECKING:
    from elastic.store.base import StoreBase


@dataclass(frozen=True)
class WatchEvent:
    kind: str  # "put" or "delete"
    key: str
    value: bytes
    revision: int


class PrefixWatch:
    """Events under a prefix from `start_revision` on (0: from now), delivered through `get`/iteration.

    `range_end`: watch [prefix, range_end) instead of the prefix. `events`: deliver into this queue, shared
    with other watches (a view made of several ranges reads one queue).
    """

    def __init__(self, store: StoreBase, prefix: str, start_revision: int = 0, range_end: str | None = None,
                 events: queue.Queue[WatchEvent | BaseException] | None = None) -> None:
        self.store = store
        self.prefix = prefix
        self.range_end = range_end.encode() if range_end is not None else prefix_range_end(prefix.encode())
        self._next_revision = start_revision
        self._events: queue.Queue[WatchEvent | BaseException] = events if events is not None else queue.Queue()
        self._stopped = threading.Event()
        self._ready = threading.Event()
        self.reconnects = 0  # how many times the stream broke under this watch and it was created again
        self._hub = store.watch_hub
        self._hub.add(self)

    @property
    def next_revision(self) -> int:
        """The revision the watch will (re)start from."""
        return self._next_revision

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def wait_ready(self, timeout: float) -> bool:
        """True once etcd created the watch (on its first stream)."""
        return self._ready.wait(timeout)

    def get(self, timeout: float | None = None) -> WatchEvent | None:
        """The next event, or None when `timeout` passes without one."""
        try:
            item = self._events.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    def drain(self) -> list[WatchEvent]:
        """Every event already received, without waiting."""
        events: list[WatchEvent] = []
        while (event := self.get(timeout=0)) is not None:
            events.append(event)
        return events

    def __iter__(self) -> Iterator[WatchEvent]:
        while not self._stopped.is_set():
            event = self.get(timeout=0.5)
            if event is not None:
                yield event

    def cancel(self) -> None:
        self._stopped.set()
        self._hub.remove(self)

    def __enter__(self) -> PrefixWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()

    # --- called by the hub (under its lock) ---

    def _created(self, revision: int) -> None:
        if self._next_revision == 0:
            self._next_revision = revision + 1
        self._ready.set()

    def _deliver(self, events: Sequence[WatchEvent]) -> None:
        for event in events:
            self._events.put(event)
            self._next_revision = event.revision + 1

    def _compacted(self, compact_revision: int) -> None:
        self._end(WatchCompactedError(
            f"watch on {self.prefix} cannot resume: etcd compacted revisions up to {compact_revision} "
            f"(needed {self._next_revision})"))

    def _end(self, error: BaseException) -> None:
        """No more events will come: the consumer gets `error` after the events already delivered."""
        self._events.put(error)


class WatchHubLike(Protocol):
    """What carries a connection's watches: `PrefixWatch` registers with it and cancels through it."""

    def add(self, watch: PrefixWatch) -> None: ...

    def remove(self, watch: PrefixWatch) -> None: ...

    def close(self) -> None: ...
