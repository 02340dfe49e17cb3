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
import threading
from collections.abc import Callable

from elastic.rendezvous.run import JobRun
from elastic.rendezvous.state import JobState
from elastic.store import Entry, PrefixWatch


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
    def __init__(self, run: JobRun, on_change: Callable[[], None] = lambda: None) -> None:
        """`on_change`: called (from the watch thread) each time a key the protocol decides on moved, or the
        watch failed."""
        self.run = run
        self._on_change = on_change
        entries, revision = run.store.get_prefix(run.keys.prefix)
        self._entries: dict[str, Entry] = {e.key: e for e in entries}
        self._revision = revision
        # The latest revision at which a key the protocol decides on changed: progress, the status and the
        # agents' store move the revision without changing the state, and are not worth a parse of every member.
        self._deciding_revision = revision
        self._parsed: JobState | None = None
        self._changed = threading.Condition()
        self._watch = PrefixWatch(run.store, run.keys.prefix, start_revision=revision + 1)
        self._stopped = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._follow, name="job-view", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        try:
            while not self._stopped.is_set():
                event = self._watch.get(timeout=0.5)
                if event is None:
                    continue
                # Apply everything already received before waking anyone: when N members join at once,
                # each of them decides once per burst of events rather than once per event.
                deciding = False
                with self._changed:
                    for e in [event, *self._watch.drain()]:
                        if e.kind == "delete":
                            self._entries.pop(e.key, None)
                        else:
                            self._entries[e.key] = Entry(e.key, e.value, e.revision, 0, 0)
                        self._revision = e.revision
                        if self.run.decides_on(e.key):
                            deciding, self._deciding_revision = True, e.revision
                    self._changed.notify_all()
                if deciding:
                    self._on_change()
        except BaseException as err:  # a compacted watch: make every reader fall back to etcd
            with self._changed:
                self._error = err
                self._changed.notify_all()
            self._on_change()

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
            return self.run.read()
        with self._changed:
            parsed, revision = self._parsed, self._revision
            if parsed is not None and parsed.revision >= self._deciding_revision:
                if parsed.revision != revision:
                    parsed = self._parsed = dataclasses.replace(parsed, revision=revision)
                return parsed
            entries = list(self._entries.values())
        # Parsed outside the lock, so that the watch thread is never held up by a reader.
        parsed = JobState.parse(self.run.keys, [e for e in entries if self.run.decides_on(e.key)], revision)
        with self._changed:
            if self._parsed is None or self._parsed.revision < revision:
                self._parsed = parsed
        return parsed

    def entry(self, key: str) -> Entry | None:
        """One key as the view has it (any key under the job's prefix, including the agents' store)."""
        if self._error is not None:
            return self.run.store.get(key)
        with self._changed:
            return self._entries.get(key)

    def wait_for_change(self, after_revision: int, timeout: float | None) -> bool:
        """Block until the view moves past `after_revision`; False on timeout."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._revision > after_revision or self._error is not None, timeout=timeout
            )

    def close(self) -> None:
        self._stopped.set()
        self._watch.cancel()
        self._thread.join(timeout=5)
