"""Prefix watches that resume where they left off, all of one connection on one gRPC stream.

etcd's watch stream dies with the connection (an etcd restart, a failover). A watch here reconnects and asks
for events from the revision after the last one it delivered, so a consumer sees every event exactly once
and in order, across any number of disconnects; only compaction of the needed revisions ends it.

Every watch of one `Store` rides one Watch stream (`WatchHub`), as etcd's own Go client multiplexes them:
etcd still keeps one watcher per watch and sends each its own events, but the client holds one stream and
one reading thread however many watches it has. A stream per watch cost a thread pair each, and gRPC's
blocking iterator wakes every 0.1 s per stream: 1,024 simulated members with two watches each spent the
machine's two cores waking up (issue 27).
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import pyetcd

from elastic.errors import StoreUnavailableError, WatchCompactedError
from elastic.store.client import stream_requests

if TYPE_CHECKING:
    from elastic.store.client import Store

log = logging.getLogger(__name__)

STREAM_ERRORS: tuple[type[BaseException], ...] = (grpc.RpcError, pyetcd.Etcd3Exception, StoreUnavailableError)


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

    def _create_request(self) -> Any:
        key = self.prefix.encode()
        return pyetcd.etcdrpc.WatchCreateRequest(
            key=key,
            range_end=self._range_end or pyetcd.utils.prefix_range_end(key),
            start_revision=self._next_revision,
        )

    def _created(self, revision: int) -> None:
        if self._next_revision == 0:
            self._next_revision = revision + 1
        self._ready.set()

    def _deliver(self, raw_events: Sequence[Any]) -> None:
        for raw in raw_events:
            kind = "delete" if raw.type == raw.DELETE else "put"
            self._events.put(WatchEvent(kind, raw.kv.key.decode(), bytes(raw.kv.value), raw.kv.mod_revision))
            self._next_revision = raw.kv.mod_revision + 1

    def _compacted(self, compact_revision: int) -> None:
        self._end(WatchCompactedError(
            f"watch on {self.prefix} cannot resume: etcd compacted revisions up to {compact_revision} "
            f"(needed {self._next_revision})"))

    def _end(self, error: BaseException) -> None:
        """No more events will come: the consumer gets `error` after the events already delivered."""
        self._events.put(error)


class WatchHub:
    """The one Watch stream of a `Store`, carrying all of its watches.

    Creates are pipelined and matched to etcd's `created` answers in order (etcd handles a stream's
    requests one by one and holds back a new watch's events until its `created` answer is sent); events are
    routed by watch id. When the stream breaks, every watch is created again from its own next revision on
    a new stream (another endpoint if the failed one is marked failed). The stream closes when the last
    watch is cancelled, and opens again with the next.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._active: dict[int, PrefixWatch] = {}  # by etcd's watch id, on the current stream
        self._pending: list[PrefixWatch] = []  # to be created (on the next stream, or now)
        self._creating: collections.deque[PrefixWatch] = collections.deque()  # sent, not yet answered
        self._requests: queue.Queue[Any] | None = None  # the current stream's requests; None: no stream
        self._call: Any = None
        self._running = False
        self._closed = threading.Event()
        self.streams_opened = 0

    def add(self, watch: PrefixWatch) -> None:
        with self._lock:
            self._pending.append(watch)
            if self._running:
                self._send_creates()
                return
            self._running = True
        threading.Thread(target=self._run, name="etcd-watch-stream", daemon=True).start()

    def remove(self, watch: PrefixWatch) -> None:
        with self._lock:
            if watch in self._pending:
                self._pending.remove(watch)
            for watch_id, active in list(self._active.items()):
                if active is watch:
                    del self._active[watch_id]
                    self._send(pyetcd.etcdrpc.WatchRequest(
                        cancel_request=pyetcd.etcdrpc.WatchCancelRequest(watch_id=watch_id)))
            # a watch whose create is in flight is cancelled when etcd answers it (`_dispatch`)
            self._end_stream_if_idle()

    def close(self) -> None:
        """The connection closes: its watches end, each told so (never left waiting on a stream that is gone)."""
        self._closed.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()
            ended = [w for w in (*self._pending, *self._creating, *self._active.values()) if not w.stopped]
            self._pending.clear()
            self._creating.clear()
            self._active.clear()
        for watch in ended:
            watch._end(StoreUnavailableError(f"the etcd connection of the watch on {watch.prefix} was closed"))

    # --- under the lock ---

    def _idle(self) -> bool:
        return not self._active and not self._pending and not self._creating

    def _end_stream_if_idle(self) -> None:
        if self._idle() and self._call is not None:
            self._call.cancel()

    def _send(self, request: Any) -> None:
        if self._requests is not None:
            self._requests.put(request)

    def _send_creates(self) -> None:
        if self._requests is None:
            return
        while self._pending:
            watch = self._pending.pop(0)
            self._creating.append(watch)
            self._requests.put(pyetcd.etcdrpc.WatchRequest(create_request=watch._create_request()))

    def _dispatch(self, response: Any) -> None:
        if self._closed.is_set():
            return  # every watch was ended by `close`: what the stream still brings (a create's answer) is no one's
        if response.created:
            watch = self._creating.popleft()
            if response.compact_revision:
                watch._compacted(response.compact_revision)
            elif response.canceled:
                self._pending.insert(0, watch)
                raise ValueError(f"etcd refused the watch on {watch.prefix}: {response.cancel_reason}")
            elif watch.stopped:
                self._send(pyetcd.etcdrpc.WatchRequest(
                    cancel_request=pyetcd.etcdrpc.WatchCancelRequest(watch_id=response.watch_id)))
                self._end_stream_if_idle()
            else:
                self._active[response.watch_id] = watch
                watch._created(response.header.revision)
            return
        watch = self._active.get(response.watch_id)
        if watch is None:
            return  # cancelled by us: its last events, or etcd's answer to the cancel
        if response.compact_revision:
            del self._active[response.watch_id]
            watch._compacted(response.compact_revision)
        elif response.canceled:
            del self._active[response.watch_id]
            self._pending.append(watch)
            raise ValueError(f"etcd cancelled the watch on {watch.prefix}: {response.cancel_reason}")
        else:
            watch._deliver(response.events)

    # --- the stream's thread ---

    def _run(self) -> None:
        backoff = 0.05
        while True:
            with self._lock:
                if self._idle() or self._closed.is_set():
                    self._running = False
                    return
            try:
                self._stream_once()
                backoff = 0.05
            except (*STREAM_ERRORS, ValueError) as err:
                if isinstance(err, grpc.RpcError) and err.code() != grpc.StatusCode.CANCELLED:
                    self.store.fail_endpoint()
                log.debug("watch stream broke (%s); resuming every watch where it left off", err)
            with self._lock:
                if self._idle():
                    continue
                for watch in self._pending:
                    watch.reconnects += 1
            self._closed.wait(backoff)
            backoff = min(backoff * 2, 1.0)

    def _stream_once(self) -> None:
        client = self.store.client
        requests: queue.Queue[Any] = queue.Queue()
        stub = pyetcd.etcdrpc.WatchStub(client.channel)
        with self._lock:
            if self._idle() or self._closed.is_set():
                return
            call = stub.Watch(stream_requests(requests), credentials=client.call_credentials, metadata=client.metadata)
            self._call, self._requests = call, requests
            self.streams_opened += 1
            self._send_creates()
        try:
            for response in call:
                with self._lock:
                    self._dispatch(response)
        finally:
            requests.put(None)  # ends gRPC's thread that reads the requests
            with self._lock:
                self._call = self._requests = None
                # whatever was created or being created on this stream is created again on the next one
                self._pending[:0] = [w for w in (*self._creating, *self._active.values()) if not w.stopped]
                self._creating.clear()
                self._active.clear()
