"""What the controller's Prometheus metrics should move by, decided from what etcd holds: pure.

The controller is level-triggered: it may see the same status many times, or skip one. So counters are
never bumped per step; each step compares the job's sample with the last one seen and derives increments
from what went *up* (the round number, the budget's list of charges), and a recovery's durations are
observed once per round. The exporter (metrics_export.py) only applies what `advance` returns.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from elastic.rendezvous.state import JobState

START = "Start"  # the first round's opened_by: no incident, nothing to recover from
RENDEZVOUS, FIRST_STEP = "rendezvous", "first_step"


@dataclass(frozen=True)
class JobSample:
    """One job as one controller step saw it: etcd's round, budget and progress, and the status it wrote."""

    run_id: str
    phase: str
    round: int | None = None  # None: no round record yet
    opened_by: str = START
    opened_at: float = 0.0
    sealed_at: float | None = None
    world_size: int = 0
    members: int = 0  # live members (agents holding a lease)
    desired: int = 0
    active: int = 0
    spares: int = 0  # warm spares ready beyond the desired size
    restarts_used: int = 0
    restarts_max: int = 0
    charge_reasons: tuple[str, ...] = ()  # reasons of the budget's charges, oldest first
    step: int | None = None  # rank 0's last reported step


@dataclass(frozen=True)
class Seen:
    """What this controller counted of a job so far (per run id: a resubmitted job starts afresh)."""

    run_id: str
    round: int | None = None
    charges: int = 0
    recovering: int | None = None  # the round whose recovery is being timed
    step_at_seal: int | None = None  # rank 0's step when that round was seen sealed
    observed: frozenset[str] = frozenset()  # the recovery phases already observed for that round


@dataclass(frozen=True)
class Updates:
    rounds: int = 0  # rounds opened since the last sample
    charges: tuple[str, ...] = ()  # one reason per new charge
    recovery: tuple[tuple[str, float], ...] = ()  # (phase, seconds since the incident)


def sample_of(run_id: str, state: JobState, status: dict[str, Any]) -> JobSample:
    """The sample of one step: `state` as observed, `status` as written (phase, replicas, progress)."""
    current, budget = state.round, state.budget
    restarts = status.get("restarts", {})
    replicas = status.get("replicas", {})
    return JobSample(
        run_id=run_id,
        phase=str(status.get("phase", "")),
        round=current.number if current else None,
        opened_by=current.opened_by if current else START,
        opened_at=current.opened_at if current else 0.0,
        sealed_at=current.sealed_at if current and current.sealed else None,
        world_size=int(status.get("worldSize", 0)),
        members=len(state.members),
        desired=int(replicas.get("desired", 0)),
        active=int(replicas.get("active", 0)),
        spares=int(status.get("spares", {}).get("ready", 0)),
        restarts_used=int(restarts.get("used", 0)),
        restarts_max=int(restarts.get("max", 0)),
        charge_reasons=tuple(c.reason for c in budget.charges) if budget else (),
        step=status.get("progress", {}).get("step"),
    )


def advance(seen: Seen | None, sample: JobSample, now: float) -> tuple[Seen, Updates]:
    """The new `Seen` and what the metrics move by. A job first seen counts what etcd holds already
    (round 0 included), so a controller that has watched a job from its start reads the same as etcd."""
    if seen is None or seen.run_id != sample.run_id:
        seen = Seen(sample.run_id)
    if sample.round is None:
        return seen, Updates()
    before = -1 if seen.round is None else seen.round
    rounds = max(0, sample.round - before)
    charges = sample.charge_reasons[seen.charges :]
    seen = replace(seen, round=max(before, sample.round), charges=max(seen.charges, len(sample.charge_reasons)))
    seen, recovery = _time_recovery(seen, sample, now)
    return seen, Updates(rounds=rounds, charges=charges, recovery=recovery)


def _time_recovery(seen: Seen, sample: JobSample, now: float) -> tuple[Seen, tuple[tuple[str, float], ...]]:
    """A round opened by an incident (anything but the first round) is a recovery: rendezvous ends when
    the round is sealed (etcd's sealed_at), first step when rank 0's step moves after the seal (as this
    controller sees it: within its period and the worker's report interval)."""
    if sample.round is None or sample.opened_by == START or not sample.opened_at:
        return seen, ()
    if seen.recovering != sample.round:
        seen = replace(seen, recovering=sample.round, step_at_seal=None, observed=frozenset())
    if sample.sealed_at is None:
        return seen, ()
    phases: list[tuple[str, float]] = []
    if RENDEZVOUS not in seen.observed:
        phases.append((RENDEZVOUS, max(0.0, sample.sealed_at - sample.opened_at)))
        seen = replace(seen, step_at_seal=sample.step, observed=seen.observed | {RENDEZVOUS})
    elif FIRST_STEP not in seen.observed and sample.step is not None and sample.step != seen.step_at_seal:
        phases.append((FIRST_STEP, max(0.0, now - sample.opened_at)))
        seen = replace(seen, observed=seen.observed | {FIRST_STEP})
    return seen, tuple(phases)
