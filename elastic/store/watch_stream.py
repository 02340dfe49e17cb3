"""All watches of one gRPC connection on one Watch stream.

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
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import grpc
import pyetcd

from elastic.errors import StoreUnavailableError
from elastic.store.client import stream_requests
from elastic.store.watch import PrefixWatch, WatchEvent

if TYPE_CHECKING:
    from elastic.store.client import Store

log = logging.getLogger(__name__)

STREAM_ERRORS: tuple[type[BaseException], ...] = (grpc.RpcError, pyetcd.Etcd3Exception, StoreUnavailableError)


def _create_request(watch: PrefixWatch) -> Any:
    return pyetcd.etcdrpc.WatchCreateRequest(
        key=watch.prefix.encode(), range_end=watch.range_end, start_revision=watch.next_revision
    )


def _events(raw_events: Sequence[Any]) -> list[WatchEvent]:
    return [WatchEvent("delete" if raw.type == raw.DELETE else "put", raw.kv.key.decode(), bytes(raw.kv.value),
                       raw.kv.mod_revision) for raw in raw_events]


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
            self._requests.put(pyetcd.etcdrpc.WatchRequest(create_request=_create_request(watch)))

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
            watch._deliver(_events(response.events))

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
