"""A Store whose every write holds only while its controller is still the elected leader (fencing).

A controller can be deposed without noticing at once: its lease lapses during a pause, another controller
is elected, and the old one wakes up mid-step. If its writes went through, two controllers would act on
one job. Here every write is a transaction that also compares the leader key's mod revision to the epoch
this controller was elected at: once the key is gone or re-created by another controller, that revision
can never come back, so every later write of the deposed leader fails in etcd itself, changes nothing,
and raises `NotLeaderError`.

Reads and leases go to the wrapped Store unchanged (one connection): only writes need the fence.
Rendezvous code written against `Store` (JobRun, shared with the agents) needs no change; agents keep
the plain Store.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from elastic.errors import NotLeaderError
from elastic.store.client import Store
from elastic.store.ops import Compare, Delete, ModRevisionIs, Op, Put, TxnResult, dumps


class FencedStore(Store):
    """`store`'s connection, with `ModRevisionIs(leader_key, epoch)` added to every write."""

    def __init__(self, store: Store, leader_key: str, epoch: int, holder: str) -> None:
        super().__init__(store.endpoints_text, timeout=store.timeout, retry_seconds=store.retry_seconds)
        self.inner = store
        self.fence = ModRevisionIs(leader_key, epoch)
        self.holder = holder

    @property
    def client(self) -> Any:
        """The wrapped store's client: a fenced view opens no connection of its own."""
        return self.inner.client

    def close(self) -> None:
        """Nothing to close: the connection belongs to the wrapped store."""

    def holds(self) -> bool:
        """The fence still holds (the leader key is the one this controller created)."""
        entry = self.inner.get(self.fence.key)
        return entry is not None and entry.mod_revision == self.fence.revision

    def txn(self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()) -> TxnResult:
        """The caller's transaction with the fence added; `NotLeaderError` when the fence failed.

        Failure branches are refused: they would run exactly when the fence fails, i.e. a deposed leader
        would write. (No controller write uses one.)
        """
        if failure:
            raise ValueError("a fenced transaction cannot have failure ops: they would run when the fence fails")
        result = super().txn([*compare, self.fence], success)
        # A failed fence never holds again (revisions only grow), so reading it afterwards is exact.
        if not result.succeeded and not self.holds():
            raise self.not_leader()
        return result

    def put(self, key: str, value: bytes | str, lease: int | None = None) -> int:
        return self._write(f"put {key}", Put(key, value, lease)).revision

    def put_json(self, key: str, obj: Any, lease: int | None = None) -> int:
        return self.put(key, dumps(obj), lease)

    def delete(self, key: str) -> bool:
        """Delete `key`; True when it existed (read first: a fenced delete reports no count)."""
        existed = self.inner.get(key) is not None
        self._write(f"delete {key}", Delete(key))
        return existed

    def delete_prefix(self, prefix: str) -> int:
        """Delete every key under `prefix`; returns how many there were just before."""
        count = len(self.inner.get_prefix(prefix)[0])
        self._write(f"delete --prefix {prefix}", Delete(prefix, prefix=True))
        return count

    def _write(self, what: str, op: Op) -> TxnResult:
        result = super().txn([self.fence], [op])
        if not result.succeeded:
            raise self.not_leader(what)
        return result

    def not_leader(self, what: str = "a transaction") -> NotLeaderError:
        return NotLeaderError(
            f"controller {self.holder} is no longer the leader (elected at revision {self.fence.revision}; "
            f"{self.fence.key} changed since), so etcd refused {what}: another controller acts now"
        )
