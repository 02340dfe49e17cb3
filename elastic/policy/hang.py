"""Whether a worker's current step is overdue, and what that means for it (pure; the Session acts on it).

Heartbeats only say a process is alive; a worker stuck in its own code, or left alone in a collective whose
peers moved on, is alive too. A step deadline of k x the median step time (never under a floor) tells them
apart from a slow step, and *where* the worker waits says who is at fault:
- overdue outside any collective: this worker's own code hangs, the peers wait for it: it is the failure;
- in a collective after its round ended: its peers left and will never finish it: abandon (a free restart);
- in a collective while the round still holds: a victim of someone else's hang, which that one reports.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Verdict(enum.Enum):
    CONTINUE = "continue"
    HUNG = "hung"
    ABANDON = "abandon"


@dataclass(frozen=True)
class HangSettings:
    factor: float = 10.0  # a step may take this many median steps
    floor_seconds: float = 10.0  # ... and never less than this (first steps, jittery machines)
    abandon_after_seconds: float = 1.0  # grace for a collective to fail on its own once the round ended
    min_steps: int = 3  # no median before this many steps: only the abandon rule applies


def step_deadline(step_seconds: list[float], settings: HangSettings) -> float | None:
    """How long the current step may take; None until enough steps were seen to know what is normal."""
    if len(step_seconds) < settings.min_steps:
        return None
    ordered = sorted(step_seconds)
    median = ordered[len(ordered) // 2]
    return max(settings.factor * median, settings.floor_seconds)


def abandon_after(step_seconds: list[float], settings: HangSettings) -> float:
    """How long a collective may run on after its round ended before the worker gives it up: the grace, or
    two median steps if longer (a big all-reduce in flight when a scale-up ends the round still finishes,
    and a worker that gave it up would lose its state)."""
    if len(step_seconds) < settings.min_steps:
        return settings.abandon_after_seconds
    return max(settings.abandon_after_seconds, 2 * sorted(step_seconds)[len(step_seconds) // 2])


def runnable_elapsed(wall_elapsed: float, waited_for_cpu: float) -> float:
    """How long a step has had to make progress: its wall time less the time this worker spent runnable but
    waiting for a CPU (a loaded machine slows a step; it does not make it hang). A stopped or deadlocked worker
    waits for no CPU, so its wall time counts whole (issue 44)."""
    return max(0.0, wall_elapsed - max(0.0, waited_for_cpu))


def verdict(
    elapsed: float, deadline: float | None, in_collective: bool, round_over: bool, settings: HangSettings,
    grace: float | None = None,
) -> Verdict:
    """What a worker does `elapsed` seconds into a step (or into the current collective, when in one).
    `grace`: see `abandon_after` (default: the settings' fixed grace)."""
    if in_collective:
        if round_over and elapsed > (settings.abandon_after_seconds if grace is None else grace):
            return Verdict.ABANDON
        return Verdict.CONTINUE
    if deadline is not None and elapsed > deadline:
        return Verdict.HUNG
    return Verdict.CONTINUE


# Process states (Linux /proc/<pid>/stat) in which a worker cannot run its own watchdog.
CANNOT_RUN = frozenset({"T", "t", "D"})  # stopped (SIGSTOP, a debugger), uninterruptible sleep


def frozen(kind: str, since: float, deadline: float | None, now: float, process_state: str | None) -> bool:
    """Whether the agent must end a worker that cannot end itself: its heartbeat says it is past its step
    deadline (in a step or in a collective) and its process cannot run, so its own watchdog never will.

    A worker past its deadline that *can* run is left to its watchdog: in a collective while the round holds
    it is a victim waiting for a peer (docs/design.md §3.15), and killing it would blame the wrong worker.
    """
    if kind == "idle" or deadline is None or process_state not in CANNOT_RUN:
        return False
    return now - since > deadline
