"""A live, watch-maintained copy of one job's keys.

`num_nodes_waiting()` is polled by torch's agent every monitor interval; answering it from this copy
keeps steady-state training free of etcd requests (only lease keep-alives remain). Waiters block on
`wait_for_change` instead of polling.
"""

from __future__ import annotations

import threading

from elastic.rendezvous.run import JobRun
from elastic.rendezvous.state import JobState
from elastic.store import Entry, PrefixWatch


class JobView:
    def __init__(self, run: JobRun) -> None:
        self.run = run
        entries, revision = run.store.get_prefix(run.keys.prefix)
        self._entries: dict[str, Entry] = {e.key: e for e in entries}
        self._revision = revision
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
                with self._changed:
                    for e in [event, *self._watch.drain()]:
                        if e.kind == "delete":
                            self._entries.pop(e.key, None)
                        else:
                            self._entries[e.key] = Entry(e.key, e.value, e.revision, 0, 0)
                        self._revision = e.revision
                    self._changed.notify_all()
        except BaseException as err:  # a compacted watch: make every reader fall back to etcd
            with self._changed:
                self._error = err
                self._changed.notify_all()

    @property
    def revision(self) -> int:
        return self._revision

    @property
    def following(self) -> bool:
        """False once the watch failed: `state()` then reads etcd and `wait_for_change` no longer blocks."""
        return self._error is None

    def state(self) -> JobState:
        """The job's state at the latest revision seen; parsed once per revision (polled every 0.2 s)."""
        if self._error is not None:
            return self.run.read()
        with self._changed:
            parsed, revision = self._parsed, self._revision
            if parsed is not None and parsed.revision == revision:
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
