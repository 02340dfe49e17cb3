"""Rendezvous handlers driven directly, without torchrun or training: for the scale and overhead benchmarks.

Each member is one handler, built the way torchrun builds it for that backend:
- `etcd-v3`: this project's plugin (`elastic.rendezvous.plugin.create_handler`), one etcd client per member;
- `c10d`: torch's `DynamicRendezvousHandler` on a `C10dRendezvousBackend`, one TCPStore client per member,
  wrapped in `CountingStore` so that every store call the handler makes is counted (etcd counts its own
  requests in `/metrics`; a TCPStore server has no such counters).
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters


class CountingStore(dist.Store):
    """A c10d Store that forwards to another and counts the calls and the bytes it returns.

    One call is one request of the TCPStore protocol, except `get`, which TCPStore sends as a WAIT followed
    by a GET (so the wire carries up to `calls + calls['get']` messages).
    """

    def __init__(self, inner: dist.Store) -> None:
        super().__init__()
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.bytes_read = 0
        self._lock = threading.Lock()

    def _count(self, op: str, read: bytes = b"") -> None:
        with self._lock:
            self.calls[op] += 1
            self.bytes_read += len(read)

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()
            self.bytes_read = 0

    def set(self, key: str, value: Any) -> None:
        self._count("set")
        self.inner.set(key, value)

    def get(self, key: str) -> bytes:
        value = self.inner.get(key)
        self._count("get", value)
        return value

    def add(self, key: str, amount: int) -> int:
        self._count("add")
        return self.inner.add(key, amount)

    def compare_set(self, key: str, expected_value: Any, desired_value: Any) -> bytes:
        value = self.inner.compare_set(key, expected_value, desired_value)
        self._count("compare_set", value)
        return value

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._count("wait")
        if timeout is None:
            self.inner.wait(keys)
        else:
            self.inner.wait(keys, timeout)

    def check(self, keys: list[str]) -> bool:
        self._count("check")
        return self.inner.check(keys)

    def delete_key(self, key: str) -> bool:
        self._count("delete_key")
        return self.inner.delete_key(key)

    def num_keys(self) -> int:
        self._count("num_keys")
        return self.inner.num_keys()

    def set_timeout(self, timeout: timedelta) -> None:
        self.inner.set_timeout(timeout)


def c10d_store_server() -> dist.TCPStore:
    """The c10d rendezvous store, hosted by the benchmark (in torchrun the first agent hosts it)."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True, wait_for_workers=False)


def make_handler(
    backend: str, endpoint: str, run_id: str, min_nodes: int, max_nodes: int, index: int,
    conf: dict[str, Any] | None = None, etcd: Any = None,
) -> tuple[RendezvousHandler, CountingStore | None]:
    """One member's handler, connected (so that connecting is not what gets timed). `etcd`: an
    `elastic.store.Store` the member shares with others of its process (one gRPC channel; each member still
    has its own lease, watches and decisions); None: a connection of its own, as an agent process has."""
    params = RendezvousParameters(
        backend=backend, endpoint=endpoint, run_id=run_id, min_nodes=min_nodes, max_nodes=max_nodes,
        local_addr="127.0.0.1", **(conf or {}),
    )
    if backend == "etcd-v3":
        from elastic.rendezvous.config import RendezvousConfig
        from elastic.rendezvous.handler import EtcdV3RendezvousHandler

        # What the `torchrun.handlers` entry point builds (elastic.rendezvous.plugin.create_handler).
        handler = EtcdV3RendezvousHandler(RendezvousConfig.from_parameters(params), store=etcd)
        # Many members share one process here; the member id (host-pid-16 random bits) is unique per agent
        # process, not per thread, so make it unique per thread.
        handler.member_id = f"{handler.member_id}-m{index}"  # type: ignore[attr-defined]
        handler.store.get("/bench/connect")  # type: ignore[attr-defined]
        return handler, None
    if backend == "c10d":
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler as create_dynamic

        host, port = endpoint.rsplit(":", 1)
        tcp = dist.TCPStore(host, int(port), is_master=False, multi_tenant=True, timeout=timedelta(seconds=60))
        store = CountingStore(tcp)
        rdzv_backend = C10dRendezvousBackend(store, run_id)
        handler = create_dynamic(store, rdzv_backend, params)
        store.reset()
        return handler, store
    raise ValueError(f"unknown backend {backend!r}")
