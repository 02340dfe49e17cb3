"""A `torch.distributed.Store` on etcd, for the agents of one round.

torch's agent uses the store returned by `next_rendezvous` to assign worker ranks, to publish
MASTER_ADDR/MASTER_PORT for the workers, and for its exit barrier. Keeping it in etcd under
`store/<round>/` means no agent hosts it (killing any one agent cannot take it down, unlike c10d's), and
ending a round deletes the prefix, so nothing of one round is reused by the next.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist

from elastic.rendezvous.view import JobView
from elastic.store import ModRevisionIs, Put, StoreBase


class EtcdAgentStore(dist.Store):
    def __init__(
        self, store: StoreBase, prefix: str, lease: int | None, view: JobView,
        still_valid: Callable[[], bool] | None = None,
    ) -> None:
        """`still_valid`: checked while waiting for keys; once False the wait fails at once (in-place
        workers building a group for a round that ended meanwhile must not wait out the timeout)."""
        super().__init__()
        self._store = store
        self._prefix = prefix
        self._lease = lease
        self._view = view
        self._still_valid = still_valid

    def _key(self, key: str) -> str:
        return self._prefix + key

    def set(self, key: str, value: bytes | str) -> None:
        self._store.put(self._key(key), value, self._lease)

    def get(self, key: str) -> bytes:
        return self._wait_for([key], self.timeout)[0]

    def add(self, key: str, amount: int) -> int:
        full = self._key(key)
        while True:
            entry = self._store.get(full)
            value = int(entry.value) + amount if entry else amount
            revision = entry.mod_revision if entry else 0
            if self._store.txn([ModRevisionIs(full, revision)], [Put(full, str(value), self._lease)]).succeeded:
                return value

    def compare_set(self, key: str, expected_value: bytes | str, desired_value: bytes | str) -> bytes:
        full = self._key(key)
        while True:
            entry = self._store.get(full)
            current = entry.value if entry else b""
            if current != _bytes(expected_value) and not (entry is None and _bytes(expected_value) == b""):
                return current
            revision = entry.mod_revision if entry else 0
            if self._store.txn([ModRevisionIs(full, revision)], [Put(full, desired_value, self._lease)]).succeeded:
                return _bytes(desired_value)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._wait_for(keys, timeout or self.timeout)

    def check(self, keys: list[str]) -> bool:
        return all(self._store.get(self._key(k)) is not None for k in keys)

    def delete_key(self, key: str) -> bool:
        return self._store.delete(self._key(key))

    def num_keys(self) -> int:
        return len(self._store.get_prefix(self._prefix)[0])

    def _wait_for(self, keys: list[str], timeout: timedelta) -> list[bytes]:
        deadline = time.monotonic() + timeout.total_seconds()
        while True:
            seen = self._view.revision
            # From the watched view, not etcd: N agents waiting for rank 0's MASTER_ADDR cost no requests.
            entries = [self._view.entry(self._key(k)) for k in keys]
            if all(entries):
                return [e.value for e in entries if e]
            if self._still_valid is not None and not self._still_valid():
                raise dist.DistStoreError(f"the round of {self._prefix} ended while waiting for keys {keys}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = [k for k, e in zip(keys, entries, strict=True) if e is None]
                raise dist.DistStoreError(f"timed out after {timeout} waiting for keys {missing} under {self._prefix}")
            self._view.wait_for_change(seen, timeout=min(remaining, 1.0))


def _bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()
