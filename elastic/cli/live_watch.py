"""Following one job live (`elastic status -w`, `elastic run`): a watch on its keys drives the view.

A poll could miss a round that failed and re-formed between two reads; the watch hands over every revision
of the round, budget and status keys in order, so each Restarting and each round change is shown. On a
terminal the view is redrawn in place (rich's Live); otherwise (a log, CI, `--no-tty`) each change is one
plain line and no control code is ever written.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Protocol

from rich.console import Console
from rich.live import Live

from elastic.cli.common import say
from elastic.cli.live_state import LiveState, advance, snapshot
from elastic.cli.live_view import event_line, render, status_line
from elastic.store import Entry, JobKeys, PrefixWatch, Store, WatchEvent
from elastic.store.outage import Outage

log = logging.getLogger(__name__)

REFRESH_SECONDS = 0.5  # the view's clock ("last progress 3s ago") ticks this often with no event


class Sink(Protocol):
    def show(self, state: LiveState, now: float) -> None: ...

    def close(self) -> None: ...


class PlainSink:
    """One line per change (phase, round, world size, replicas, restarts, step): for logs and CI."""

    def __init__(self) -> None:
        self.last: LiveState | None = None

    def show(self, state: LiveState, now: float) -> None:
        if state.changed_from(self.last):
            self.last = state
            print(status_line(state, now - state.started), flush=True)

    def close(self) -> None:
        pass


class LiveSink:
    """The table redrawn in place; what else the process prints goes above it."""

    def __init__(self, console: Console | None = None) -> None:
        self.live = Live(console=console or Console(), auto_refresh=False, redirect_stdout=True,
                         redirect_stderr=True)  # fmt: skip
        self.live.start()

    def show(self, state: LiveState, now: float) -> None:
        self.live.update(render(state, now), refresh=True)

    def close(self) -> None:
        self.live.stop()


def make_sink(no_tty: bool) -> Sink:
    """A live view on a terminal, plain lines otherwise or when asked (`--no-tty`)."""
    return PlainSink() if no_tty or not sys.stdout.isatty() else LiveSink()


def by_revision(events: list[WatchEvent]) -> list[list[WatchEvent]]:
    """Events grouped by the revision that wrote them, in order."""
    groups: list[list[WatchEvent]] = []
    for event in events:
        if groups and groups[-1][-1].revision == event.revision:
            groups[-1].append(event)
        else:
            groups.append([event])
    return groups


class JobFollower:
    """Feeds every revision of one job's keys to a sink, from a snapshot and a watch that resumes after it."""

    def __init__(self, store: Store, keys: JobKeys, sink: Sink, clock: Callable[[], float] = time.time,
                 say: Callable[[str], None] = say) -> None:
        self.say = say
        self.store = store
        self.keys = keys
        self.sink = sink
        self.clock = clock
        self.state = LiveState(f"{keys.namespace}/{keys.name}", clock())
        self.revision = 0
        self._stop_at: int | None = None
        self._shown = {keys.round, keys.budget, keys.closed, keys.status, keys.progress, keys.run}

    def follow(self, done: Callable[[LiveState], bool] = lambda state: state.final) -> LiveState:
        """Show the job until `done(state)` or `finish()`; returns the last state shown. etcd away when the view
        starts is a wait, said once; later, the watch itself waits and resumes where it left off."""
        entries, self.revision = Outage("the view", say=self.say).call(lambda: self.store.get_prefix(self.keys.prefix))
        table = {e.key: e for e in entries}
        self._advance(table)
        with PrefixWatch(self.store, self.keys.prefix, start_revision=self.revision + 1) as watch:
            while not done(self.state) and not self._caught_up():
                event = watch.get(timeout=REFRESH_SECONDS)
                if event is None:
                    self.sink.show(self.state, self.clock())  # the clock of "last progress" moves on
                    continue
                for revision in by_revision([event, *watch.drain()]):
                    self._apply(table, revision)
        return self.state

    def _apply(self, table: dict[str, Entry], events: list[WatchEvent]) -> None:
        """One revision (a transaction writes several keys at once: its round and its charge show together)."""
        for event in events:
            if event.kind == "delete":
                table.pop(event.key, None)
            else:
                table[event.key] = Entry(event.key, event.value, event.revision, 0, 0)
        self.revision = events[-1].revision
        if any(event.key in self._shown for event in events):
            self._advance(table)

    def _advance(self, table: dict[str, Entry]) -> None:
        now = self.clock()
        self.state = advance(self.state, snapshot(self.keys, table.values()), now, event_line)
        self.sink.show(self.state, now)

    def last_change(self) -> int:
        """The revision of the job's last write. Not etcd's revision: that may be another key's (the
        controller resigning just before), which this watch never sees, and waiting for it stalls the end."""
        entries, _ = self.store.get_prefix(self.keys.prefix)
        return max((entry.mod_revision for entry in entries), default=0)

    def finish(self, revision: int) -> None:
        """Stop once every change up to `revision` was shown (the last one of a job that just ended)."""
        self._stop_at = revision

    def _caught_up(self) -> bool:
        return self._stop_at is not None and self.revision >= self._stop_at


class Following:
    """`elastic run`'s view: a JobFollower in a thread beside the controller, shown until the job ended."""

    def __init__(self, store: Store, keys: JobKeys, no_tty: bool) -> None:
        self.sink = make_sink(no_tty)
        self.follower = JobFollower(store, keys, self.sink)
        self._thread = threading.Thread(target=self._run, name="live view", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.follower.follow(done=lambda _: False)
        except Exception as err:  # the view is for people: the job runs on without it
            log.warning("the live view stopped: %s", err)

    def close(self, timeout: float = 5.0) -> None:
        """Show what happened up to now (the job's end), then hand the terminal back."""
        try:
            self.follower.finish(self.follower.last_change())
        except Exception as err:  # etcd is gone: show what was seen
            log.debug("no last revision for the live view: %s", err)
            self.follower.finish(0)
        self._thread.join(timeout)
        self.sink.close()
