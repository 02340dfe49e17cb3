"""Every lease of one connection refreshed on one LeaseKeepAlive stream.

pyetcd opens a new bidirectional stream (and gRPC a thread to feed it) for every single keep-alive; a
process that keeps many leases (the scale benchmark's members, a controller) paid a stream setup per
refresh. etcd answers keep-alives on one stream in order, each answer naming its lease, so one stream
serves them all, as etcd's own Go client does.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from typing import TYPE_CHECKING, Any

import grpc
import pyetcd
from pyetcd import exceptions as etcd_exceptions

from elastic.errors import StoreUnavailableError
from elastic.store.client import stream_requests

if TYPE_CHECKING:
    from elastic.store.client import Store

log = logging.getLogger(__name__)


class _Answer:
    """One keep-alive's answer: the lease's new TTL, or why none came."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ttl = 0
        self.error: BaseException | None = None


class KeepAliveStream:
    """Send a keep-alive for any lease and wait for its answer; the stream opens on first use and again
    after it breaks (answers it owed then fail, as a transient error the lease keeper retries)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._waiting: dict[int, list[_Answer]] = {}  # by lease id, oldest first
        self._requests: queue.Queue[Any] | None = None  # the open stream's; None: no stream
        self._call: Any = None
        self._closed = False
        self.streams_opened = 0

    def refresh(self, lease_id: int, timeout: float) -> int:
        """The lease's TTL after this keep-alive; 0 when etcd no longer has the lease."""
        answer = _Answer()
        with self._lock:
            if self._closed:
                raise etcd_exceptions.ConnectionFailedError()
            if self._requests is None:
                self._open()
            assert self._requests is not None
            self._waiting.setdefault(lease_id, []).append(answer)
            self._requests.put(pyetcd.etcdrpc.LeaseKeepAliveRequest(ID=lease_id))
        if not answer.done.wait(timeout):
            # No answer in time: the stream may be half-open (its endpoint frozen or cut off). End it, so
            # that the next keep-alive opens another, on another endpoint, as a fresh call per keep-alive did.
            with self._lock:
                with contextlib.suppress(KeyError, ValueError):
                    self._waiting[lease_id].remove(answer)
                if self._call is not None:
                    self.store.fail_endpoint()
                    self._call.cancel()
            raise etcd_exceptions.ConnectionTimeoutError()
        if answer.error is not None:
            raise answer.error
        return answer.ttl

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._call is not None:
                self._call.cancel()

    def _open(self) -> None:
        """Open the stream and start reading it (under the lock)."""
        try:
            client = self.store.client
            stub = pyetcd.etcdrpc.LeaseStub(client.channel)
        except (pyetcd.Etcd3Exception, StoreUnavailableError) as err:
            raise etcd_exceptions.ConnectionFailedError() from err
        requests: queue.Queue[Any] = queue.Queue()
        self._call = stub.LeaseKeepAlive(stream_requests(requests), credentials=client.call_credentials,
                                         metadata=client.metadata)
        self._requests = requests
        self.streams_opened += 1
        threading.Thread(target=self._read, args=(self._call, requests), name="etcd-keep-alive", daemon=True).start()

    def _read(self, call: Any, requests: queue.Queue[Any]) -> None:
        error: BaseException = etcd_exceptions.ConnectionFailedError()
        try:
            for response in call:
                with self._lock:
                    answers = self._waiting.get(response.ID)
                    if answers:
                        answer = answers.pop(0)
                        answer.ttl = int(response.TTL)
                        answer.done.set()
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                error = etcd_exceptions.ConnectionTimeoutError()
            elif err.code() != grpc.StatusCode.CANCELLED:
                self.store.fail_endpoint()
            log.debug("lease keep-alive stream broke: %s", err)
        finally:
            requests.put(None)  # ends gRPC's thread that reads the requests
            with self._lock:
                if self._requests is requests:
                    self._call = self._requests = None
                owed = [a for answers in self._waiting.values() for a in answers]
                self._waiting.clear()
            for answer in owed:
                answer.error = error
                answer.done.set()
