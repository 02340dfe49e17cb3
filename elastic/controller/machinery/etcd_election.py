"""Electing the one acting local controller through etcd (etcd's own `concurrency` election pattern).

Two `elastic controller --backend local` processes on one etcd would otherwise both start workers for
every job. The leader is whoever created the leased key `/elastic/controllers/leader` (a transaction that
requires the key to be absent). Its lease is kept alive while the process lives; a killed leader's key
goes when the lease expires, and a waiting controller creates it next, within one lease TTL plus one
poll. The key's mod revision at creation is the leader's *epoch*: every write of the leader carries a
compare on it (`FencedStore`), so a deposed leader that has not noticed yet cannot write.

`decide()` is the pure decision; `Election` does the reads and writes. No clock is compared across
hosts: expiry is etcd's lease TTL, judged by etcd alone.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from elastic.codec import leader_holder
from elastic.errors import ElasticError
from elastic.store import Entry, LeaseKeeper, ModRevisionIs, Put, Store
from elastic.store.fenced import FencedStore
from elastic.store.keys import controller_leader_key

log = logging.getLogger(__name__)

# How long a killed leader blocks a takeover: short enough for a quick failover, long enough that a
# loaded machine's keep-alives (every TTL/3) do not miss it.
LEADER_LEASE_SECONDS = 5


class Step(str, Enum):
    CAMPAIGN = "campaign"  # nobody leads: try to create the key
    LEAD = "lead"  # the key is the one we created, on our live lease: act
    FOLLOW = "follow"  # another controller leads: wait
    STEP_DOWN = "step-down"  # we led, but our lease or our key is gone: stop acting now


@dataclass(frozen=True)
class LeaderRecord:
    """The leader key as read: who holds it and at which epoch (its mod revision)."""

    holder: str
    epoch: int
    lease: int
    info: dict[str, Any]

    @classmethod
    def from_entry(cls, entry: Entry) -> LeaderRecord:
        holder, info = leader_holder(entry.key, entry.value)
        return cls(holder, entry.mod_revision, entry.lease, info)


def decide(record: LeaderRecord | None, my_epoch: int | None, lease_alive: bool) -> Step:
    """What this controller does next, given the leader key and what it believes about itself."""
    if my_epoch is not None:
        if lease_alive and record is not None and record.epoch == my_epoch:
            return Step.LEAD
        return Step.STEP_DOWN
    return Step.CAMPAIGN if record is None else Step.FOLLOW


def default_holder(role: str) -> str:
    """A holder id that names the process for people (`etcdctl get`) and is unique per process start."""
    return f"{role}@{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"


class Election:
    """One process's part in the election: call `lead()` before each step of acting."""

    def __init__(
        self,
        store: Store,
        role: str = "controller",
        ttl: int = LEADER_LEASE_SECONDS,
        on_change: Callable[[str], None] | None = None,
        key: str | None = None,
    ) -> None:
        self.store = store
        self.role = role
        self.ttl = ttl
        self.key = key or controller_leader_key()
        self.holder = default_holder(role)
        self._on_change = on_change
        self._keeper: LeaseKeeper | None = None
        self._fenced: FencedStore | None = None
        self._followed: str | None = None

    @property
    def epoch(self) -> int | None:
        return self._fenced.fence.revision if self._fenced is not None else None

    def read(self) -> LeaderRecord | None:
        entry = self.store.get(self.key)
        return LeaderRecord.from_entry(entry) if entry is not None else None

    def lead(self) -> FencedStore | None:
        """One election step: the fenced store while this process leads, None while another one does."""
        record = self.read()
        step = decide(record, self.epoch, self._keeper is not None and not self._keeper.lost.is_set())
        if step is Step.LEAD:
            return self._fenced
        if step is Step.STEP_DOWN:
            self._step_down(record)
            return None
        if step is Step.CAMPAIGN:
            return self._campaign()
        if record is not None and record.holder != self._followed:
            self._followed = record.holder
            self._tell(f"standing by: controller {record.holder} leads (epoch {record.epoch})")
        return None

    def _campaign(self) -> FencedStore | None:
        keeper = LeaseKeeper.grant(self.store, self.ttl)
        info = {"holder": self.holder, "role": self.role, "pid": os.getpid(), "since": time.time()}
        result = self.store.txn([ModRevisionIs(self.key, 0)], [Put.json(self.key, info, keeper.lease_id)])
        if not result.succeeded:  # another controller was faster
            keeper.revoke()
            return None
        self._keeper = keeper
        # The transaction's revision is the key's mod revision: the epoch every fenced write compares.
        self._fenced = FencedStore(self.store, self.key, result.revision, self.holder)
        self._followed = None
        self._tell(f"leading: controller {self.holder} elected (epoch {result.revision})")
        return self._fenced

    def _step_down(self, record: LeaderRecord | None) -> None:
        why = (self._keeper.lost_reason if self._keeper and self._keeper.lost.is_set() else "") or (
            "the leader key is gone" if record is None else f"controller {record.holder} leads now"
        )
        self._tell(f"stepped down: {why}")
        self._release()

    def resign(self) -> None:
        """Give leadership up now (the key goes with the lease), so a waiting controller need not wait."""
        if self._fenced is not None:
            self._tell(f"resigned: controller {self.holder}")
        self._release()

    def _release(self) -> None:
        keeper, self._keeper, self._fenced = self._keeper, None, None
        if keeper is not None:
            try:
                keeper.revoke()
            except ElasticError as err:  # the lease then expires by itself within its TTL
                log.warning("could not revoke the leader lease %x: %s", keeper.lease_id, err)

    def _tell(self, line: str) -> None:
        log.info(line)
        if self._on_change is not None:
            self._on_change(line)
