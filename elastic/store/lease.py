"""Keeping a lease alive, and saying clearly when it is lost.

A member's keys live as long as its lease. The keep-alive must ride out a short etcd hiccup (an etcd
restart takes about a second) yet report *lost* as soon as etcd confirms the lease is gone, or once a whole
TTL has passed without a successful refresh (by then etcd has expired it anyway).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from elastic.store.base import StoreBase

log = logging.getLogger(__name__)


def keep_alive_errors(store: StoreBase) -> tuple[type[BaseException], ...]:
    """A keep-alive that failed, for whatever reason etcd or the wire gives, is retried until a whole TTL has
    passed; never may it end the keeper's thread unseen. An overloaded etcd answers `UNKNOWN: context deadline
    exceeded`, which pyetcd passes through as a bare gRPC error (seen at 256 members on 2 cores)."""
    return (*store.transient_errors, *store.refusal_errors)


class LeaseKeeper:
    """A background thread that refreshes one lease every `ttl / 3` seconds."""

    def __init__(
        self,
        store: StoreBase,
        lease_id: int,
        ttl: int,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.lease_id = lease_id
        self.ttl = ttl
        self._on_lost = on_lost
        self._stop = threading.Event()
        self.lost = threading.Event()
        self.lost_reason = ""
        # True when the lease was lost because no keep-alive reached etcd (an outage on this side), not
        # because etcd expired it while we were talking to it: the difference between a store outage
        # and a lost member (docs/design.md §3.11).
        self.unreachable = False
        self.last_failure = 0.0  # monotonic time of the last keep-alive that did not reach etcd
        self._thread = threading.Thread(target=self._run, name=f"lease-{lease_id:x}", daemon=True)

    @classmethod
    def grant(cls, store: StoreBase, ttl: int, on_lost: Callable[[str], None] | None = None) -> LeaseKeeper:
        """Grant a lease and start keeping it alive."""
        keeper = cls(store, store.grant(ttl), ttl, on_lost)
        keeper.start()
        return keeper

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        period = max(self.ttl / 3.0, 0.2)
        interval = period * random.uniform(0.8, 1.0)  # members started together do not refresh together
        retry = 0.2
        last_ok = time.monotonic()
        errors = keep_alive_errors(self.store)
        while not self._stop.wait(interval):
            try:
                remaining = self.store.refresh_once(self.lease_id)
            except errors as err:
                self.last_failure = time.monotonic()
                if time.monotonic() - last_ok > self.ttl:
                    self.unreachable = True
                    self._lose(f"no keep-alive reached etcd for {self.ttl} s ({self.store.describe_error(err)})")
                    return
                log.debug("lease %x keep-alive failed, will retry: %s", self.lease_id, err)
                # Back off: when etcd is overloaded, N keepers retrying every 0.2 s only overload it more.
                interval, retry = retry * random.uniform(0.5, 1.0), min(retry * 2, period)
                continue
            if remaining <= 0:
                # Expired while our keep-alives could not get through: the outage's doing, not ours.
                self.unreachable = time.monotonic() - self.last_failure < 2 * self.ttl if self.last_failure else False
                self._lose("etcd reports the lease expired or was revoked")
                return
            last_ok = time.monotonic()
            interval, retry = period * random.uniform(0.8, 1.0), 0.2

    def _lose(self, reason: str) -> None:
        self.lost_reason = reason
        log.warning("lease %x lost: %s", self.lease_id, reason)
        try:
            if self._on_lost is not None:
                self._on_lost(reason)
        finally:
            self.lost.set()  # last, so that a waiter on `lost` sees the callback's effects

    def confirm_lost(self) -> bool:
        """A write under this lease was refused as "lease not found": ask etcd, and if the lease is indeed gone,
        report it lost now rather than at the next keep-alive (up to a third of the TTL later, meanwhile every
        write under it fails)."""
        if self.lost.is_set():
            return True
        if self.store.lease_ttl(self.lease_id) > 0:
            return False
        self._stop.set()
        self._lose("etcd reports the lease expired or was revoked")
        return True

    def stop(self) -> None:
        """Stop refreshing (the lease then expires after its TTL)."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def revoke(self) -> None:
        """Stop refreshing and revoke, so that the keys go now rather than after the TTL."""
        self.stop()
        self.store.revoke(self.lease_id)
