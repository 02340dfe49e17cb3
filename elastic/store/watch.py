"""A prefix watch that resumes where it left off.

etcd's watch stream dies with the connection (an etcd restart, a failover). This watch reconnects and asks
for events from the revision after the last one it delivered, so a consumer sees every event exactly once
and in order, across any number of disconnects; only compaction of the needed revisions ends it.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pyetcd

from elastic.errors import WatchCompactedError
from elastic.store.client import Store

log = logging.getLogger(__name__)


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

    def __init__(self, store: Store, prefix: str, start_revision: int = 0, range_end: str | None = None,
                 events: queue.Queue[WatchEvent | BaseException] | None = None) -> None:
        self.store = store
        self.prefix = prefix
        self._range_end = range_end.encode() if range_end is not None else None
        self._next_revision = start_revision
        self._events: queue.Queue[WatchEvent | BaseException] = events if events is not None else queue.Queue()
        self._stopped = threading.Event()
        self._call: Any = None
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self.reconnects = 0
        self._thread = threading.Thread(target=self._run, name=f"watch {prefix}", daemon=True)
        self._thread.start()

    @property
    def next_revision(self) -> int:
        """The revision the watch will (re)start from."""
        return self._next_revision

    def wait_ready(self, timeout: float) -> bool:
        """True once the first watch stream is established."""
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
        with self._lock:
            if self._call is not None:
                self._call.cancel()
        self._thread.join(timeout=5)

    def __enter__(self) -> PrefixWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()

    # --- the stream ---

    def _run(self) -> None:
        backoff = 0.05
        while not self._stopped.is_set():
            try:
                self._stream_once()
                backoff = 0.05
            except WatchCompactedError as err:
                self._events.put(err)
                return
            except (grpc.RpcError, pyetcd.Etcd3Exception, ValueError) as err:
                if self._stopped.is_set():
                    return
                if isinstance(err, grpc.RpcError):
                    self._fail_over()
                log.debug("watch on %s broke (%s); resuming at revision %d", self.prefix, err, self._next_revision)
            self.reconnects += 1
            self._stopped.wait(backoff)
            backoff = min(backoff * 2, 1.0)

    def _fail_over(self) -> None:
        """Mark the endpoint in use as failed so that the next stream goes to another one."""
        with contextlib.suppress(pyetcd.Etcd3Exception):
            self.store.client.endpoint_in_use.fail()

    def _stream_once(self) -> None:
        client = self.store.client
        key = self.prefix.encode()
        create = pyetcd.etcdrpc.WatchCreateRequest(
            key=key,
            range_end=self._range_end or pyetcd.utils.prefix_range_end(key),
            start_revision=self._next_revision,
        )
        stop = self._stopped

        def requests() -> Iterator[Any]:
            yield pyetcd.etcdrpc.WatchRequest(create_request=create)
            while not stop.wait(3600):
                pass

        stub = pyetcd.etcdrpc.WatchStub(client.channel)
        with self._lock:
            if stop.is_set():
                return
            self._call = stub.Watch(requests(), credentials=client.call_credentials, metadata=client.metadata)
        started = time.monotonic()
        for response in self._call:
            if response.compact_revision:
                raise WatchCompactedError(
                    f"watch on {self.prefix} cannot resume: etcd compacted revisions up to "
                    f"{response.compact_revision} (needed {self._next_revision})"
                )
            if response.created:
                if self._next_revision == 0:
                    self._next_revision = response.header.revision + 1
                self._ready.set()
            for raw in response.events:
                kind = "delete" if raw.type == raw.DELETE else "put"
                event = WatchEvent(kind, raw.kv.key.decode(), bytes(raw.kv.value), raw.kv.mod_revision)
                self._events.put(event)
                self._next_revision = raw.kv.mod_revision + 1
            if response.canceled:
                raise ValueError(f"etcd canceled the watch: {response.cancel_reason}")
        if time.monotonic() - started < 0.01 and not stop.is_set():
            raise ValueError("watch stream ended at once")
