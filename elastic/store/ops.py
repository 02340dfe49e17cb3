"""What a caller says to etcd and gets back, free of any wire: keys read, transactions' comparisons and
operations, and stored JSON.

Kept apart from both transports (`client`, gRPC; `gateway`, HTTP/JSON) so that code that only builds
transactions, and a training process that must never import gRPC (docs/design.md, "Fork safety"), can use
them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Entry:
    """One key as read from etcd."""

    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    lease: int


@dataclass(frozen=True)
class ModRevisionIs:
    """The key was last written at this revision; 0 means the key must not exist."""

    key: str
    revision: int


@dataclass(frozen=True)
class UnchangedSince:
    """No key under `prefix` was written after `revision` (one comparison, however many keys).

    etcd caps a transaction's comparisons (--max-txn-ops, 128 by default): comparing every member key one
    by one would make rounds of 128+ members impossible to seal.
    """

    prefix: str
    revision: int


@dataclass(frozen=True)
class ValueIs:
    key: str
    value: bytes | str


@dataclass(frozen=True)
class Put:
    key: str
    value: bytes | str
    lease: int | None = None

    @classmethod
    def json(cls, key: str, obj: Any, lease: int | None = None) -> Put:
        return cls(key, dumps(obj), lease)


@dataclass(frozen=True)
class Delete:
    key: str
    prefix: bool = False


Compare = ModRevisionIs | UnchangedSince | ValueIs
Op = Put | Delete


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int


def dumps(obj: Any) -> str:
    """JSON as stored: compact, keys sorted, so `etcdctl get` output is stable."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def as_bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def prefix_range_end(prefix: bytes) -> bytes:
    """The end of the range [prefix, end) that holds every key starting with `prefix` (etcd's rule: the last
    byte below 0xff incremented, the bytes after it dropped; no such byte: every key, b"\\0")."""
    for i in range(len(prefix) - 1, -1, -1):
        if prefix[i] < 0xFF:
            return prefix[:i] + bytes([prefix[i] + 1])
    return b"\0"


def txn_subject(compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]) -> str:
    """A transaction named by what it touches, so that a refusal (permission denied) says which keys."""
    touched = [c.prefix if isinstance(c, UnchangedSince) else c.key for c in compare]
    touched += [o.key for o in (*success, *failure)]
    return f"transaction on {os.path.commonpath(touched) if touched else '?'}"
