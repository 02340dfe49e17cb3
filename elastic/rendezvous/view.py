"""A live, watch-maintained copy of one job's keys.

`num_nodes_waiting()` is polled by torch's agent every monitor interval; answering it from this copy
keeps steady-state training free of etcd requests (only lease keep-alives remain). Waiters block on
`wait_for_change` instead of polling; a process that also waits on other things (the in-place agent, on its
workers' sentinels) waits on a `ChangeSignal` beside them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from elastic.codec import CorruptValueError
from elastic.rendezvous.run import JobRun
from elastic.rendezvous.state import JobState, Round, bucket_of
from elastic.store import Entry, PrefixWatch
from elastic.store.watch import WatchEvent

# How long a member waits for its bucket of a seal's ranks to come on its watch before it reads it.
OWN_RANK_WAIT_SECONDS = 2.0


class ChangeSignal:
    """A pipe that becomes readable when the view moves, for `multiprocessing.connection.wait` and `select`.

    The in-place agent sleeps on its workers' sentinels; without this it learned of a round ended elsewhere
    only at its next monitor tick (0.2 s), and a round waits for its slowest member to re-join.
    """

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._lock = threading.Lock()
        self._closed = False  # a closed descriptor's number may be reused: never write to it again

    def fileno(self) -> int:
        return self._read

    def notify(self) -> None:
        with self._lock:
            if self._closed:
                return
            with contextlib.suppress(BlockingIOError):  # full: a wake-up is pending already
                os.write(self._write, b"\0")

    def clear(self) -> None:
        """Consume pending wake-ups; call before reading the state, so that a later change wakes again."""
        with self._lock:
            if self._closed:
                return
            try:
                while os.read(self._read, 4096):
                    pass
            except BlockingIOError:
                pass

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self._read)
                os.close(self._write)


class JobView:
    """The job's keys as last seen, kept current by a watch.

    A member's view (`member` given) holds the job's keys but the roster's (`JobKeys.roster_range`: the
    member keys and the rank buckets), plus its own member key and its own rank bucket: what it receives per
    round then stays the same however many members the job has (docs/design.md §3.20). The sealer widens its
    view to every key (`widen`); the controller and the CLI read everything from the start.
    """

    def __init__(self, run: JobRun, on_change: Callable[[], None] = lambda: None, member: str | None = None) -> None:
        """`on_change`: called (from the watch thread) each time a key the protocol decides on moved, or the
        watch failed."""
        self.run = run
        self.member = member
        self._on_change = on_change
        self._changed = threading.Condition()
        self._entries: dict[str, Entry] = {}
        # The entries a JobState is parsed from (`JobRun.decides_on`), kept beside every entry as events come:
        # the sealer's view holds every member key, and filtering them again at every parse was O(N) per event.
        self._deciding: dict[str, Entry] = {}
        self._revision = 0
        # Counts the changes of keys the protocol decides on (and of what this view holds): progress, the
        # status and the agents' store move the revision without changing the state, and are not worth a parse
        # of every member. A count, not a revision: our own writes and our bucket are not in revision order.
        self._generation = 0
        self._parsed: tuple[int, JobState] | None = None
        self._watches: list[PrefixWatch] = []
        self._events: queue.Queue[WatchEvent | BaseException] = queue.Queue()
        self._whole = member is None
        self._stopped = threading.Event()
        self._error: BaseException | None = None
        self.events_received = 0  # watch events delivered to this view: what its scope costs per round
        self._load()
        self._thread = threading.Thread(target=self._follow, name="job-view", daemon=True)
        self._thread.start()

    @property
    def whole(self) -> bool:
        """True when the view holds every key of the job (the roster's too)."""
        return self._whole

    def widen(self) -> None:
        """Hold every key of the job from now on (this member became the sealer)."""
        with self._changed:
            if self._whole:
                return
            self._whole = True
        self._load()
        self._on_change()  # the roster is in the state now: whoever waits on the signal decides again

    def wrote(self, key: str, value: bytes | None, revision: int) -> None:
        """Our own write of a key a member's view does not watch (its own member key): keep it as written
        (None: it is gone, e.g. with a lost lease)."""
        with self._changed:
            if not self._whole:
                self._put(key, None if value is None else Entry(key, value, revision, 0, 0))
                self._generation += 1

    def _load(self) -> None:
        """Read the view's keys and watch them from the revision after: a fresh queue, so that nothing the
        previous watches still deliver (older than this read) is applied over it."""
        run, keys = self.run, self.run.keys
        if self._whole:
            entries, revision = run.store.get_prefix(keys.prefix)
            ranges: list[tuple[str, str | None]] = [(keys.prefix, None)]
        else:
            assert self.member is not None  # a view that does not hold every key is a member's
            member_ranges = run.member_ranges(self.member)
            entries, revision = run.store.get_ranges(member_ranges)
            ranges = list(member_ranges)
        events: queue.Queue[WatchEvent | BaseException] = queue.Queue()
        watches = [PrefixWatch(run.store, start, revision + 1, range_end=end, events=events) for start, end in ranges]
        with self._changed:
            old, old_events = self._watches, self._events
            # Nothing of a member's view outlives a load: at start it is empty, and widening reads every key.
            self._entries = {e.key: e for e in entries}
            self._deciding = {e.key: e for e in entries if self.run.decides_on(e.key)}
            self._revision = max(self._revision, revision)
            self._generation += 1
            self._watches, self._events = watches, events
            self._changed.notify_all()
        for watch in old:
            watch.cancel()
        self._wake(old_events)

    def _put(self, key: str, entry: Entry | None) -> bool:
        """Set (None: drop) one key of the view, in the parse's entries too when the protocol decides on it;
        returns whether it does."""
        deciding = self.run.decides_on(key)
        if entry is None:
            self._entries.pop(key, None)
            if deciding:
                self._deciding.pop(key, None)
        else:
            self._entries[key] = entry
            if deciding:
                self._deciding[key] = entry
        return deciding

    def _follow(self) -> None:
        try:
            while not self._stopped.is_set():
                events = self._events
                batch = [events.get()]  # no polling: `close` and `_load` wake this with `_WAKE_UP`
                # Apply everything already received before waking anyone: when N members join at once,
                # each of them decides once per burst of events rather than once per event.
                with contextlib.suppress(queue.Empty):
                    while True:
                        batch.append(events.get_nowait())
                self._hold_for_own_rank(events, batch)
                applied = [e for e in batch if not isinstance(e, BaseException) and e is not _WAKE_UP]
                if not applied and all(e is _WAKE_UP for e in batch):
                    continue
                self.events_received += len(applied)
                deciding = False
                with self._changed:
                    if events is not self._events:
                        continue  # widened meanwhile: the new read holds all of it
                    for e in applied:
                        held = self._entries.get(e.key)
                        if held is not None and e.revision < held.mod_revision:
                            continue  # older than what a read (`_hold_for_own_rank`) already gave us
                        decides = self._put(e.key, None if e.kind == "delete" else _entry(e))
                        self._revision = max(self._revision, e.revision)
                        deciding = deciding or decides
                    if deciding:
                        self._generation += 1
                    self._changed.notify_all()
                if deciding:
                    self._on_change()
                for item in batch:
                    if isinstance(item, BaseException):
                        raise item
        except BaseException as err:  # a compacted watch: make every reader fall back to etcd
            with self._changed:
                self._error = err
                self._changed.notify_all()
            self._on_change()

    def _hold_for_own_rank(self, events: queue.Queue[WatchEvent | BaseException], batch: list[Any]) -> None:
        """Nobody may see its round sealed without its own rank (it would conclude that it was left out), nor a
        round opened without whether it is expected back (it would write its key again, and hold up the seal),
        nor its bucket of a round whose record it has not seen yet (a seal following at once the end of the
        round before: the new ranks beside the old, open round record). Every write of our bucket is a write
        of the round record in the same transaction, but the two come on two watches, in either order. While
        the batch holds one without the other, wait for it (a moment: the same stream carries it), else read
        both."""
        deadline = time.monotonic() + OWN_RANK_WAIT_SECONDS
        while self._out_of_step(batch):
            try:
                batch.append(events.get(timeout=max(deadline - time.monotonic(), 0.0)))
            except queue.Empty:
                assert self.member is not None
                keys = (self.run.keys.round, self.run.keys.rank_bucket(bucket_of(self.member)))
                entries, revision = self.run.store.get_ranges([(key, key + "\0") for key in keys])
                read = {e.key: _event(e) for e in entries}
                batch.extend(read.get(key, WatchEvent("delete", key, b"", revision)) for key in keys)
                return

    def _out_of_step(self, batch: list[Any]) -> bool:
        """Whether applying `batch` would show the round record and this member's bucket at two different
        transactions' writes of them (see `_hold_for_own_rank`)."""
        if self._whole or self.member is None or any(isinstance(e, BaseException) or e is _WAKE_UP for e in batch):
            return False
        keys = self.run.keys
        bucket = bucket_of(self.member)
        bucket_key = keys.rank_bucket(bucket)
        rounds = [e for e in batch if e.key == keys.round]
        with self._changed:
            held_round, held_bucket = self._entries.get(keys.round), self._entries.get(bucket_key)
        round_revision = rounds[-1].revision if rounds else held_round.mod_revision if held_round else 0
        bucket_revision = max([e.revision for e in batch if e.key == bucket_key]
                              + [held_bucket.mod_revision if held_bucket else 0])
        if bucket_revision > round_revision:
            return True  # our bucket moved with a round record still on its way
        if not rounds or rounds[-1].kind == "delete":
            return False
        try:
            current = Round.decode(_entry(rounds[-1]))
        except CorruptValueError:
            return False  # the state reports the bad record
        return current.wrote_bucket(bucket) and bucket_revision < round_revision

    @property
    def revision(self) -> int:
        return self._revision

    @property
    def following(self) -> bool:
        """False once the watch failed: `state()` then reads etcd and `wait_for_change` no longer blocks."""
        return self._error is None

    def state(self) -> JobState:
        """The job's state at the latest revision seen (polled every 0.2 s): parsed again only when a key the
        protocol decides on changed since the last parse; else the same state, at the latest revision."""
        if self._error is not None:
            return self.run.read(None if self._whole else self.member)
        with self._changed:
            revision, generation = self._revision, self._generation
            if self._parsed is not None and self._parsed[0] == generation:
                parsed = self._parsed[1]
                if parsed.revision != revision:
                    parsed = dataclasses.replace(parsed, revision=revision)
                    self._parsed = (generation, parsed)
                return parsed
            entries, whole = list(self._deciding.values()), self._whole
        # Parsed outside the lock, so that the watch thread is never held up by a reader.
        parsed = JobState.parse(self.run.keys, entries, revision, whole)
        with self._changed:
            if self._parsed is None or self._parsed[0] < generation:
                self._parsed = (generation, parsed)
        return parsed

    def entry(self, key: str) -> Entry | None:
        """One key as the view has it (any key under the job's prefix, including the agents' store)."""
        if self._error is not None:
            return self.run.store.get(key)
        with self._changed:
            return self._entries.get(key)

    def wait_for_change(self, after_revision: int, timeout: float | None) -> bool:
        """Block until the view moves past `after_revision` (or fails, or closes); False on timeout."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._revision > after_revision or self._error is not None or self._stopped.is_set(),
                timeout=timeout,
            )

    def close(self) -> None:
        self._stopped.set()
        with self._changed:
            watches, events = list(self._watches), self._events
            self._changed.notify_all()
        for watch in watches:
            watch.cancel()
        self._wake(events)
        self._thread.join(timeout=5)

    @staticmethod
    def _wake(events: queue.Queue[WatchEvent | BaseException]) -> None:
        """Wake the thread that may be blocked reading `events` (no longer the view's, or the view closed)."""
        events.put(_WAKE_UP)


# Put in a queue of events to wake its reader; never applied (its key is in no job).
_WAKE_UP = WatchEvent("wake-up", "", b"", 0)


def _entry(event: WatchEvent) -> Entry:
    return Entry(event.key, event.value, event.revision, 0, 0)


def _event(entry: Entry) -> WatchEvent:
    return WatchEvent("put", entry.key, entry.value, entry.mod_revision)
