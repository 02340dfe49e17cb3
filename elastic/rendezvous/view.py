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
                with self._changed:
                    if event.kind == "delete":
                        self._entries.pop(event.key, None)
                    else:
                        self._entries[event.key] = Entry(event.key, event.value, event.revision, 0, 0)
                    self._revision = event.revision
                    self._changed.notify_all()
        except BaseException as err:  # a compacted watch: make every reader fall back to etcd
            with self._changed:
                self._error = err
                self._changed.notify_all()

    @property
    def revision(self) -> int:
        return self._revision

    def state(self) -> JobState:
        """The job's state at the latest revision seen; parsed once per revision (polled every 0.2 s)."""
        if self._error is not None:
            return self.run.read()
        with self._changed:
            if self._parsed is not None and self._parsed.revision == self._revision:
                return self._parsed
            entries = [e for key, e in self._entries.items() if self.run.decides_on(key)]
            self._parsed = JobState.parse(self.run.keys, entries, self._revision)
            return self._parsed

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
