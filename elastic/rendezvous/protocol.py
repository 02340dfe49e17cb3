"""The round protocol's decisions: pure functions from `JobState` to the next step (no I/O).

Borrowed from torch's dynamic rendezvous (operations that return actions, run by a separate executor),
without its single pickled blob and cross-host heartbeats: here every member has its own leased key and
the round record is changed only by transactions that compare what the decision was based on.

A round is *open* while members gather and *sealed* once ranks are fixed. Every membership change
(a failure, a lost lease, a late joiner) ends the current round by opening the next one.
"""

from __future__ import annotations

from dataclasses import dataclass

from elastic.policy.bounds import clamp_replicas, round_can_seal
from elastic.policy.budget import Charge, charge, exhausted_message
from elastic.policy.exits import Action
from elastic.policy.incident import Failure, Incident, JobEnd, RoundEnd
from elastic.rendezvous.state import Closed, JobState, Member, Round, bucket_mask, bucket_of, bucket_record, in_buckets
from elastic.store import Delete, JobKeys, ModRevisionIs, Put


@dataclass(frozen=True)
class Settings:
    min_nodes: int
    max_nodes: int
    last_call_seconds: float
    spares: int = 0  # without a controller's spec: rounds seal at max_nodes - spares (docs/design.md §3.18)


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
class EndRound:
    """The sealer, waiting outside a sealed round (a spare, a late joiner), saw it change (a member lost or
    departed, growth to wait for): nobody in the round watches the member keys, so the sealer ends it."""

    round: Round
    change: Change


@dataclass(frozen=True)
class Joined:
    round: Round
    rank: int


JoinStep = Refuse | Target | Seal | Wait | EndDeadRound | EndRound | Joined


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
        if state.roster:  # the sealer: it alone sees the members (docs/design.md §3.20)
            if current.members and not any(m in state.members or m in state.departed for m in current.members):
                return EndDeadRound(current)  # docs/design.md §3.12: else we would wait for join_timeout on nobody
            change = membership_change(state, current.number, settings)
            if change is not None and change.ends_round_itself:
                return EndRound(current, change)
        # A late joiner (or left behind): wait for the next round; the members of this one see us waiting.
        wanted = current.number + 1
        return Wait(None) if mine is not None and mine.target == wanted else Target(wanted)
    if (mine is None or mine.target != current.number) and not expected_back(current, mine):
        return Target(current.number)
    if not state.roster:
        return Wait(None)  # the sealer seals (docs/design.md §3.20)
    gathered = gathered_for(state, current)
    if round_can_seal(
        len(gathered), settings.min_nodes, seal_at(state, settings), quiet_for, settings.last_call_seconds,
        0 if current.expected else None,  # who is coming back is known, and counted in: no last call to wait
    ):
        # At most the desired size: whoever gathered beyond it waits outside the round, warm, as a spare.
        # (Ordered only now: the sealer decides at every join, and most decisions are to wait.)
        ranked = sorted(gathered, key=lambda m: rank_order(m, current))[: seal_at(state, settings)]
        return Seal(current, {m.id: rank for rank, m in enumerate(ranked)})
    if len(gathered) >= settings.min_nodes:
        return Wait(max(settings.last_call_seconds - quiet_for, 0.0))
    return Wait(None)


def expected_back(current: Round, member: Member | None) -> bool:
    """Whether `member` is in the open round without writing its key again: it was in the round before, and
    the incident that ended it found it alive (`Round.expected`). It still holds its key (a lost lease takes
    it), and its agent is restarting into this round anyway: re-writing the key would only make every one of
    N survivors write and the sealer wait for N events before sealing (docs/design.md §3.20)."""
    return member is not None and member.id in current.expected


def gathered_for(state: JobState, current: Round) -> list[Member]:
    """The members the open round has: those that wrote their key for it, and those it expects back."""
    return [m for m in state.members.values() if m.target == current.number or expected_back(current, m)]


def seal_at(state: JobState, settings: Settings) -> int:
    """The size of a round: it seals at once when this many gathered (no last call), and never takes more.

    The job's desired size when the controller wrote its spec (a scale-up, or a spare, that brings the round
    to it need not wait), else max nodes less the spares asked for. Agents beyond it are spares: they hold a
    member key for the next round and wait, warm, outside this one (docs/design.md §3.18); they trigger no
    round of their own, and the round a lost member ends takes them in at once.
    """
    job = state.spec
    if job is None:
        return max(settings.max_nodes - settings.spares, settings.min_nodes)
    spec = job.spec
    return min(clamp_replicas(spec.replicas, spec.min_replicas, spec.max_replicas), settings.max_nodes)


def spares_waiting(state: JobState) -> int:
    """Members waiting outside a sealed round for a later one: the job's warm spares (late joiners too, for
    the moment it takes the round they bring to the desired size to end)."""
    current = state.round
    if current is None or not current.sealed:
        return 0
    return sum(1 for m in state.members.values() if m.target > current.number and m.id not in current.members)


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

    reason: RoundEnd  # CLOSED, ROUND_ENDED, MEMBER_LOST, SCALE_UP, or a departure's reason (Preempted, ScaleDown)
    waiting: int = 1  # what num_nodes_waiting() reports
    member: str | None = None  # the member lost or departed

    @property
    def ends_round_itself(self) -> bool:
        """False when the round already ended (or the job closed): the agent only re-joins."""
        return self.reason not in (RoundEnd.CLOSED, RoundEnd.ROUND_ENDED)


def membership_change(state: JobState, joined_round: int, settings: Settings) -> Change | None:
    """Whether the round this agent trains in must end; None while it stays valid."""
    if state.closed is not None:
        return Change(RoundEnd.CLOSED)
    current = state.round
    if current is None or current.number != joined_round or not current.sealed:
        return Change(RoundEnd.ROUND_ENDED)
    if not state.roster:
        return None  # only the sealer sees the members: it ends the round on their changes (§3.20)
    lost = [m for m in current.members if m not in state.members and m not in state.departed]
    if lost and len(lost) == len(current.members):
        # Every lease lapsed together: nobody's node failed, etcd was away (docs/design.md §3.11). Free.
        return Change(RoundEnd.STORE_UNAVAILABLE)
    for member_id in sorted(current.members, key=current.members.__getitem__):
        if member_id in state.members:
            continue
        departure = state.departed.get(member_id)
        if departure is None:
            return Change(RoundEnd.MEMBER_LOST, member=member_id)
        if departure.reason != RoundEnd.FINISHED:
            return Change(_round_end(departure.reason), member=member_id)
    if current.world_size < seal_at(state, settings):  # below the desired size: a waiting member is growth
        waiting = spares_waiting(state)
        if waiting:
            return Change(RoundEnd.SCALE_UP, waiting=waiting)
    return None


def change_after_own_failure(change: Change | None, own: Failure | None, member_id: str) -> Change | None:
    """The change a member ends its round on, given what failed on its side (`own`: a worker's exit, reported
    with this member's id, or a broken group, with none); None when its own failure report decides.

    An etcd outage explains a lapsed lease, never a crash: when our worker died (or our group broke) in the
    outage, the outage is not the incident. Nor is our own lease, lapsed while etcd was away longer for us
    than for a peer: we are alive, so our loss is no cause; our worker's exit code, or the peer our group
    lost, is (docs/design.md §3.11). Any other change (a peer lost, a departure, a closed job) stands.
    """
    if change is None or own is None:
        return change
    if change.reason is RoundEnd.STORE_UNAVAILABLE:
        return None
    if change.reason is RoundEnd.MEMBER_LOST and change.member == member_id:
        return None
    return change


def all_finished(state: JobState) -> bool:
    """Every member of the current sealed round left with its workers all at exit 0: the job succeeded."""
    current = state.round
    return (
        current is not None
        and current.sealed
        and bool(current.members)
        and all(
            m in state.departed and state.departed[m].reason == RoundEnd.FINISHED and m not in state.members
            for m in current.members
        )
    )


def _round_end(departure: str) -> RoundEnd:
    """A departure's recorded reason as a round end; one this version does not know is a stop on purpose."""
    try:
        return RoundEnd(departure)
    except ValueError:
        return RoundEnd.PREEMPTED


# --- ending a round -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RoundEndPlan:
    """The one transaction that ends a round (docs/design.md §3.2): if `compares` hold, `ops` open the next
    round, clear the old round's keys, charge the budget and close the job as the incident requires.

    `close_anyway`: a permanent failure closes the job even when someone else ended the round first (their
    transaction may have been about a collateral report, or a change seen earlier).
    """

    compares: tuple[ModRevisionIs, ...]
    ops: tuple[Put | Delete, ...]
    close_anyway: Closed | None = None


def plan_round_end(keys: JobKeys, state: JobState, current: Round, incident: Incident, now: float) -> RoundEndPlan:
    """End `current` by opening the next round; charge or close per the incident, in one transaction.

    The transaction compares the round's mod revision, which makes one incident cost one charge however many
    observers race to report it; the budget's revision too when it is charged.
    """
    if not state.roster:
        raise ValueError("ending a round takes every member key and rank bucket: read the whole job first")
    lease = state.job_lease
    expected = tuple(sorted(m for m in state.heard_from() if m in current.members and m in state.members))
    if not expected and incident.reason is RoundEnd.MEMBER_LOST:
        # Nobody reported: the survivors' workers did not fail (in-place workers catch the error), yet
        # every member still holding a key is alive and will re-join; the lost one holds none.
        expected = tuple(sorted(m for m in current.members if m in state.members))
    elif incident.reason is RoundEnd.SCALE_UP:
        # Nothing failed: every member and every newcomer waiting for the next round is known, so the round
        # seals as soon as they are all in, without waiting out the last call.
        expected = tuple(sorted({*(m for m in current.members if m in state.members),
                                 *(m.id for m in state.members.values() if m.target > current.number)}))
    # A member whose workers all exited 0 in this round is finishing, not restarting: counted in, it would
    # hold a place its agent never takes.
    expected = tuple(m for m in expected if state.done.get(m) != current.number)
    # Who the next round expects goes into the rank buckets, beside the ranks they hold (each member watches
    # its own): an expected member then knows that it is in the round without writing its key again.
    expected_by_bucket: dict[int, list[str]] = {}
    for member_id in expected:
        expected_by_bucket.setdefault(bucket_of(member_id), []).append(member_id)
    ranks_by_bucket = in_buckets(current.members)
    following = Round(current.number + 1, opened_by=incident.reason.value, opened_at=now,
                      rank_buckets=bucket_mask(expected_by_bucket))
    # A sealer of the round that is not expected back (it stayed silent through the incident: a node lost
    # before its lease ran out) would leave the next round unsealed until its lease lapsed: depose it, and
    # the members campaign again (docs/design.md §3.20).
    silent_sealer = state.sealer is not None and state.sealer in current.members and bool(expected) and (
        state.sealer not in expected)
    ops: list[Put | Delete] = [
        Put.json(keys.round, following.to_json(), lease),
        *(Put.json(keys.rank_bucket(b), bucket_record(current.number, ranks_by_bucket.get(b, {}), ids), lease)
          for b, ids in sorted(expected_by_bucket.items())),
        *([Delete(keys.sealer)] if silent_sealer else []),
        Delete(keys.store(current.number), prefix=True),
        Delete(keys.incidents(current.number), prefix=True),
        Delete(keys.alive(current.number), prefix=True),
    ]
    compares = [ModRevisionIs(keys.round, current.mod_revision)]
    cost = plan_cost(keys, state, current.number, incident, now)
    return RoundEndPlan((*compares, *cost.compares), (*ops, *cost.ops), cost.close_anyway)


def plan_cost(keys: JobKeys, state: JobState, round_number: int, incident: Incident, now: float) -> RoundEndPlan:
    """What an incident of round `round_number` costs, as writes: a charge (and the close when it spends the
    budget), or the close of a FailJob rule; nothing when it is free.

    Part of the transaction that ends the round; alone, for a failure its agent could not report before the
    round ended for another reason, e.g. a crash during an etcd outage that ended the round for free
    (docs/design.md §3.11: the outage is free, the crash is not). Charging is keyed by the round, so a cost
    planned twice is charged once.
    """
    lease = state.job_lease
    failure = incident.failure
    if incident.action is Action.RESTART_JOB and state.budget is not None:
        spent = charge(
            state.budget,
            Charge(
                round=round_number,
                reason=incident.reason.value,
                cause=incident.describe(),
                exit_code=failure.code if failure else None,
                member=failure.member if failure else None,
                at=now,
            ),
        )
        ops: list[Put | Delete] = [Put.json(keys.budget, spent.to_json(), lease)]
        if spent.exceeded:
            closed = Closed(JobEnd.BACKOFF_LIMIT_EXCEEDED.value, exhausted_message(spent), now,
                            failure.member if failure else None, failure.error if failure else None)
            ops.append(Put.json(keys.closed, closed.to_json(), lease))
        return RoundEndPlan((ModRevisionIs(keys.budget, state.budget_revision),), tuple(ops))
    if incident.action is Action.FAIL_JOB:
        close = permanent_failure(incident, now)
        return RoundEndPlan((), (Put.json(keys.closed, close.to_json(), lease),), close)
    return RoundEndPlan((), ())


def permanent_failure(incident: Incident, now: float) -> Closed:
    """How a FailJob rule closes the job: naming the rule, the failed member and its error."""
    failure = incident.failure
    return Closed(JobEnd.FAIL_JOB_RULE.value, f"permanent failure: {incident.why or incident.reason.value}", now,
                  failure.member if failure else None, failure.error if failure else None)
