"""The round protocol's decisions: pure functions from `JobState` to the next step (no I/O).

Borrowed from torch's dynamic rendezvous (operations that return actions, run by a separate executor),
without its single pickled blob and cross-host heartbeats: here every member has its own leased key and
the round record is changed only by transactions that compare what the decision was based on.

A round is *open* while members gather and *sealed* once ranks are fixed. Every membership change
(a failure, a lost lease, a late joiner) ends the current round by opening the next one.
"""

from __future__ import annotations

from dataclasses import dataclass

from elastic.policy.bounds import round_can_seal
from elastic.rendezvous.state import JobState, Member, Round

# Why a round ended. Stable identifiers: they appear in etcd, in budget charges and in logs.
WORKER_FAILURE = "WorkerFailure"
MEMBER_LOST = "MemberLost"
SCALE_UP = "ScaleUp"
ROUND_ENDED = "RoundEnded"  # someone else ended the round: nothing to decide, just re-join
CLOSED = "Closed"
FINISHED = "Finished"
STORE_UNAVAILABLE = "StoreUnavailable"  # etcd was away: every lease lapsed together, or ours could not reach it
CORRUPT_STATE = "CorruptState"  # a member left because a key of the job does not decode


@dataclass(frozen=True)
class Settings:
    min_nodes: int
    max_nodes: int
    last_call_seconds: float


# --- join steps -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refuse:
    """The job is closed: raise, the agent must exit."""

    reason: str
    message: str


@dataclass(frozen=True)
class Target:
    """Write my member key so that it waits for this round."""

    round: int


@dataclass(frozen=True)
class Seal:
    """Seal the open round with these ranks (conditional on the round and the member keys being unchanged)."""

    round: Round
    ranks: dict[str, int]


@dataclass(frozen=True)
class Wait:
    """Nothing to do until the state changes, or `seconds` pass (None: only a change helps)."""

    seconds: float | None


@dataclass(frozen=True)
class EndDeadRound:
    """A sealed round none of whose members holds a live key: nobody in it can end it, so the joiner does."""

    round: Round


@dataclass(frozen=True)
class Joined:
    round: Round
    rank: int


JoinStep = Refuse | Target | Seal | Wait | EndDeadRound | Joined


def join_step(state: JobState, me: str, settings: Settings, quiet_for: float, after_round: int | None) -> JoinStep:
    """What an agent that wants to be in a round does next.

    `quiet_for`: seconds since the set of members waiting for the open round last changed, as this agent
    observed it (its own monotonic clock; no wall clocks are compared across hosts).
    `after_round`: the round this agent last trained in; a sealed round with that number is not one to
    join again (the caller ends it first).
    """
    if state.closed is not None:
        return Refuse(state.closed.reason, state.closed.message)
    current = state.round
    if current is None:
        raise ValueError("no round record: the run was not initialised")
    mine = state.members.get(me)
    if current.sealed:
        if me in current.members and current.number != after_round:
            return Joined(current, current.members[me])
        if current.members and not any(m in state.members or m in state.departed for m in current.members):
            return EndDeadRound(current)  # DESIGN §3.12: else we would wait for join_timeout on nobody
        # A late joiner (or left behind): wait for the next round; the members of this one see us waiting.
        wanted = current.number + 1
        return Wait(None) if mine is not None and mine.target == wanted else Target(wanted)
    if mine is None or mine.target != current.number:
        return Target(current.number)
    gathered = sorted(
        (m for m in state.members.values() if m.target == current.number), key=lambda m: rank_order(m, current)
    )
    if round_can_seal(
        len(gathered), settings.min_nodes, settings.max_nodes, quiet_for, settings.last_call_seconds,
        stragglers(state, current, {m.id for m in gathered}),
    ):
        return Seal(current, {m.id: rank for rank, m in enumerate(gathered[: settings.max_nodes])})
    if len(gathered) >= settings.min_nodes:
        return Wait(max(settings.last_call_seconds - quiet_for, 0.0))
    return Wait(None)


def stragglers(state: JobState, current: Round, gathered: set[str]) -> int | None:
    """Members the open round waits for: expected back after the incident, still holding a key, not here yet.

    None when the round expects nobody by name (then only the last call ends the wait).
    """
    if not current.expected:
        return None
    return sum(1 for m in current.expected if m in state.members and m not in gathered)


def rank_order(member: Member, current: Round) -> tuple[int, float, str]:
    """Survivors keep their relative order (rank 0 stays rank 0 if it survives); newcomers follow by arrival."""
    previous = current.previous.get(member.id)
    if previous is not None:
        return (0, float(previous), member.id)
    return (1, member.joined_at, member.id)


# --- membership changes seen while training -----------------------------------------------------


@dataclass(frozen=True)
class Change:
    """Why the current round must end, seen by a member of it."""

    reason: str  # CLOSED, ROUND_ENDED, MEMBER_LOST, SCALE_UP, or a departure's reason (Preempted, ScaleDown)
    waiting: int = 1  # what num_nodes_waiting() reports
    member: str | None = None  # the member lost or departed

    @property
    def ends_round_itself(self) -> bool:
        """False when the round already ended (or the job closed): the agent only re-joins."""
        return self.reason not in (CLOSED, ROUND_ENDED)


def membership_change(state: JobState, joined_round: int, max_nodes: int) -> Change | None:
    """Whether the round this agent trains in must end; None while it stays valid."""
    if state.closed is not None:
        return Change(CLOSED)
    current = state.round
    if current is None or current.number != joined_round or not current.sealed:
        return Change(ROUND_ENDED)
    lost = [m for m in current.members if m not in state.members and m not in state.departed]
    if lost and len(lost) == len(current.members):
        # Every lease lapsed together: nobody's node failed, etcd was away (DESIGN §3.11). Free.
        return Change(STORE_UNAVAILABLE)
    for member_id in sorted(current.members, key=current.members.__getitem__):
        if member_id in state.members:
            continue
        departure = state.departed.get(member_id)
        if departure is None:
            return Change(MEMBER_LOST, member=member_id)
        if departure.reason != FINISHED:
            return Change(departure.reason, member=member_id)
    if current.world_size < max_nodes:
        waiting = sum(1 for m in state.members.values() if m.target > current.number)
        if waiting:
            return Change(SCALE_UP, waiting=waiting)
    return None


def all_finished(state: JobState) -> bool:
    """Every member of the current sealed round left with its workers all at exit 0: the job succeeded."""
    current = state.round
    return (
        current is not None
        and current.sealed
        and bool(current.members)
        and all(
            m in state.departed and state.departed[m].reason == FINISHED and m not in state.members
            for m in current.members
        )
    )
