"""A queue of job keys to reconcile, as client-go's rate-limited work queue: each key at most once in the
queue, never handled by two workers at once, retried after a jittered, growing delay when its handling
failed, and back to no delay once it succeeded. One job's failures (a 403 from Pod Security, a 422, a 429)
slow down that job alone."""

from __future__ import annotations

import heapq
import itertools
import random
import threading
import time
from collections.abc import Hashable


def retry_delay(failures: int, base: float = 0.5, cap: float = 60.0) -> float:
    """The delay before the `failures`-th retry of a key: doubling from `base` up to `cap`, jittered down by
    up to half, so that keys failing together do not come back together (pure)."""
    if failures <= 0:
        return 0.0
    return min(cap, base * 2 ** min(failures - 1, 20)) * random.uniform(0.5, 1.0)


class WorkQueue:
    def __init__(self, base_delay: float = 0.5, max_delay: float = 60.0) -> None:
        self.base_delay, self.max_delay = base_delay, max_delay
        self._ready: list[Hashable] = []
        self._queued: set[Hashable] = set()
        self._active: set[Hashable] = set()
        self._again: set[Hashable] = set()  # added while being handled: queued again when done
        self._later: list[tuple[float, int, Hashable]] = []  # (when, tie-breaker, key)
        self._due: dict[Hashable, float] = {}  # each waiting key's one time
        self._failures: dict[Hashable, int] = {}
        self._order = itertools.count()
        self._cond = threading.Condition()

    def add(self, key: Hashable) -> None:
        with self._cond:
            self._enqueue(key)

    def _enqueue(self, key: Hashable) -> None:
        """Ready `key` once, or, while it is being handled, again right after (under the lock)."""
        if key in self._active:
            self._again.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._ready.append(key)
            self._cond.notify()

    def add_after(self, key: Hashable, seconds: float) -> None:
        """Queue `key` in `seconds`; a key waits at most once, for the earliest time asked (client-go's
        delaying queue): each event must not start another requeue chain of its own."""
        if seconds <= 0:
            self.add(key)
            return
        when = time.monotonic() + seconds
        with self._cond:
            if key in self._due and self._due[key] <= when:
                return
            self._due[key] = when
            heapq.heappush(self._later, (when, next(self._order), key))
            self._cond.notify()

    def retry(self, key: Hashable) -> float:
        """Handling `key` failed: queue it again after its next backoff delay (returned)."""
        with self._cond:
            self._failures[key] = self._failures.get(key, 0) + 1
            delay = retry_delay(self._failures[key], self.base_delay, self.max_delay)
        self.add_after(key, delay)
        return delay

    def forget(self, key: Hashable) -> None:
        """Handling `key` succeeded: its next failure starts the backoff afresh."""
        with self._cond:
            self._failures.pop(key, None)

    def get(self, timeout: float) -> Hashable | None:
        """The next key to handle (marked active until `done`), or None after `timeout`."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                self._promote_due()
                if self._ready:
                    key = self._ready.pop(0)
                    self._queued.discard(key)
                    self._active.add(key)
                    return key
                now = time.monotonic()
                if now >= deadline:
                    return None
                wake = min([deadline, *(when for when, _, _ in self._later[:1])])
                self._cond.wait(max(wake - now, 0.001))

    def done(self, key: Hashable) -> None:
        with self._cond:
            self._active.discard(key)
            if key in self._again:
                self._again.discard(key)
                self._enqueue(key)

    def __len__(self) -> int:
        with self._cond:
            return len(self._ready) + len(self._due)

    def _promote_due(self) -> None:
        now = time.monotonic()
        while self._later and self._later[0][0] <= now:
            when, _, key = heapq.heappop(self._later)
            if self._due.get(key) != when:
                continue  # superseded by an earlier time for the same key
            del self._due[key]
            self._enqueue(key)
