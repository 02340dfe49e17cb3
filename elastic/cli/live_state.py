"""What the live view of one job shows (`elastic status -w`, `elastic run`), derived from the job's keys
one revision at a time, as a watch delivers them: pure, so every case is a table of states.

The phase and the round come from the rendezvous state (round, budget, closed) through the controller's
own `phase_of`, not from the status the controller writes: the controller polls, and a round that failed
and re-formed between two polls never shows in its status, but every revision of the round key passes
through the watch. Replicas come from the status (only the controller sees processes), the step, loss
and total from what rank 0 reports (`progress`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from elastic.codec import CorruptValueError, decode_progress, status_for_display
from elastic.controller.status import FINAL_PHASES, phase_of, restarts_taken
from elastic.rendezvous.state import JobState
from elastic.store import Entry, JobKeys

RATE_WINDOW = 6  # progress reports the steps/s are measured over
EVENTS_KEPT = 8  # lines of the scrolling event list


@dataclass(frozen=True)
class Snapshot:
    """A job's keys at one revision, decoded through `elastic.codec`."""

    state: JobState
    status: dict[str, Any]
    progress: dict[str, Any] | None


def snapshot(keys: JobKeys, entries: Iterable[Entry]) -> Snapshot:
    """Decode a job's entries; a value that does not decode is left out (the status says CorruptState)."""
    by_key = {e.key: e for e in entries}
    rendezvous = [e for k, e in by_key.items() if not k.startswith((keys.store_root, keys.workers_prefix))]
    status = by_key.get(keys.status)
    progress = by_key.get(keys.progress)
    try:
        reported = decode_progress(progress.key, progress.value) if progress else None
    except CorruptValueError:
        reported = None
    return Snapshot(JobState.parse(keys, rendezvous), status_for_display(keys.status, status and status.value),
                    reported)  # fmt: skip


@dataclass(frozen=True)
class Tick:
    at: float
    step: int


@dataclass(frozen=True)
class LiveState:
    """One job as the live view shows it; `events` are the lines of the changes seen so far (the last few)."""

    job: str
    started: float = 0.0  # when the view began (elapsed times count from here)
    phase: str = "Pending"
    reason: str = ""
    message: str = ""
    round: int = 0
    world_size: int = 0
    replicas: str = "-"
    restarts: str = "-"
    step: int | None = None
    total: int | None = None
    loss: float | None = None
    progress_at: float | None = None  # when the step last moved
    ticks: tuple[Tick, ...] = ()  # the last reports of this round's run of steps, for steps/s
    incident: str | None = None
    final: bool = False  # the controller wrote a final status: nothing more will change
    events: tuple[str, ...] = ()

    @property
    def rate(self) -> float | None:
        """Steps per second over the last reports; None until two of them are apart in time."""
        if len(self.ticks) < 2 or self.ticks[-1].at <= self.ticks[0].at:
            return None
        return (self.ticks[-1].step - self.ticks[0].step) / (self.ticks[-1].at - self.ticks[0].at)

    @property
    def eta(self) -> float | None:
        """Seconds to the last step at the current rate; None without a total or a rate."""
        rate = self.rate
        if self.total is None or self.step is None or not rate or rate <= 0:
            return None
        return max(self.total - self.step, 0) / rate

    def changed_from(self, other: LiveState | None) -> bool:
        """A change worth a line of its own (the phase, the round, the budget or the step moved)."""
        return other is None or _shown(self) != _shown(other)


def _shown(state: LiveState) -> tuple[Any, ...]:
    return state.phase, state.round, state.world_size, state.replicas, state.restarts, state.step


def _milestone(state: LiveState) -> tuple[Any, ...]:
    return state.phase, state.round, state.world_size, state.restarts


def of_status(status: dict[str, Any], job: str = "", started: float = 0.0) -> LiveState:
    """The view of a status alone (the controller's own lines, the last line of `elastic run`)."""
    progress = status.get("progress", {})
    last = status.get("lastFailure") or {}
    return LiveState(
        job, started, status.get("phase", "Pending"), status.get("reason", ""), status.get("message", ""),
        status.get("round", 0), status.get("worldSize", 0), status.get("replicasText", "-"),
        status.get("restartsText", "-"), progress.get("step"), progress.get("total"), progress.get("loss"),
        incident=f"round {last['round']}: {last.get('cause', '')}" if "round" in last else None,
        final=status.get("phase") in FINAL_PHASES,
    )  # fmt: skip


EventLine = Callable[["LiveState", float], str]


def advance(previous: LiveState, snap: Snapshot, now: float, line: EventLine | None = None) -> LiveState:
    """The view after one revision. `line(state) -> str` writes an event line for each milestone (phase,
    round, world size, restarts) that changed; None keeps no events."""
    state = replace(of_status(snap.status, previous.job, previous.started),
                    events=previous.events, ticks=previous.ticks, progress_at=previous.progress_at)  # fmt: skip
    rendezvous = snap.state
    if rendezvous.round is not None or rendezvous.closed is not None:
        phase, reason, message = phase_of(rendezvous)
        current = rendezvous.round
        state = replace(state, phase=phase, reason=reason, message=message,
                        round=current.number if current else state.round,
                        world_size=current.world_size if current and current.sealed else 0)  # fmt: skip
    if rendezvous.budget is not None:
        used, limit = restarts_taken(rendezvous.budget, rendezvous.budget.max)
        charges = rendezvous.budget.charges
        state = replace(state, restarts=f"{used}/{limit}",
                        incident=f"round {charges[-1].round}: {charges[-1].cause}" if charges else state.incident)
    if rendezvous.closed is not None and not rendezvous.closed.succeeded:
        state = replace(state, incident=f"{rendezvous.closed.reason}: {rendezvous.closed.message}")
    state = _with_progress(state, previous, snap.progress, now)
    if line is not None and (previous.events == () or _milestone(state) != _milestone(previous)):
        state = replace(state, events=(*previous.events, line(state, now))[-EVENTS_KEPT:])
    return state


def _with_progress(state: LiveState, previous: LiveState, progress: dict[str, Any] | None, now: float) -> LiveState:
    """Rank 0's report; a step that moved since `previous` is a tick of the steps/s (and of its age)."""
    if progress is None:
        return state
    step, at = progress["step"], progress.get("at", now)
    ticks = state.ticks
    if step != previous.step or not ticks:
        # steps that went back (a restart resumed from its checkpoint) start a new measurement
        kept = ticks if ticks and step >= ticks[-1].step else ()
        ticks = (*kept, Tick(at, step))[-RATE_WINDOW:]
        state = replace(state, progress_at=at)
    return replace(state, step=step, loss=progress.get("loss", state.loss), total=progress.get("total", state.total),
                   ticks=ticks)  # fmt: skip
