"""The round protocol's decisions as tables: state in, step out. No etcd, no processes."""

from __future__ import annotations

import dataclasses
import json

import pytest

from elastic.codec import decode_budget
from elastic.policy.budget import Budget, Charge, charge, exhausted_message
from elastic.policy.incident import NODE_LOST, Failure, RoundEnd, incident_of
from elastic.rendezvous.protocol import (
    Change,
    EndDeadRound,
    EndRound,
    Joined,
    Refuse,
    Seal,
    Settings,
    Target,
    Wait,
    all_finished,
    change_after_own_failure,
    join_step,
    membership_change,
    plan_round_end,
    spares_waiting,
)
from elastic.rendezvous.state import Closed, Departure, JobState, Member, Round, bucket_mask, bucket_of
from elastic.spec import parse_job
from elastic.store import Delete, JobKeys, dumps

MEMBER_LOST, ROUND_ENDED, SCALE_UP = RoundEnd.MEMBER_LOST, RoundEnd.ROUND_ENDED, RoundEnd.SCALE_UP
STORE_UNAVAILABLE = RoundEnd.STORE_UNAVAILABLE

SETTINGS = Settings(min_nodes=2, max_nodes=3, last_call_seconds=2.0)


def state(round_: Round, *members: Member, closed: Closed | None = None, departed=None) -> JobState:
    return JobState(round=round_, members={m.id: m for m in members}, closed=closed, departed=departed or {})


def follower(st: JobState) -> JobState:
    """What a member that is not the sealer holds: the same keys but the others' member keys and buckets."""
    return dataclasses.replace(st, roster=False)


def m(member_id: str, target: int, joined_at: float = 0.0) -> Member:
    return Member(member_id, target, joined_at=joined_at)


OPEN0 = Round(0)
SEALED0 = Round(0, sealed=True, members={"a": 0, "b": 1})
# After a failure in round 0 in which a and b were heard from (c stayed silent: a lost node).
AFTER_FAILURE = Round(1, previous={"a": 0, "b": 1, "c": 2}, opened_by="WorkerFailure", expected=("a", "b"))
SETTINGS_1 = Settings(min_nodes=1, max_nodes=4, last_call_seconds=2.0)

JOIN_CASES = [
    ("a closed job refuses every joiner", state(OPEN0, closed=Closed("BackoffLimitExceeded", "spent")), "a", 0, None,
     Refuse("BackoffLimitExceeded", "spent")),
    ("a newcomer first writes its member key for the open round", state(OPEN0), "a", 0, None, Target(0)),
    ("one member below min waits for more, with no deadline", state(OPEN0, m("a", 0)), "a", 10, None, Wait(None)),
    ("at min, the rest of the last call is waited", state(OPEN0, m("a", 0), m("b", 0)), "a", 0.5, None, Wait(1.5)),
    ("at min after a quiet last call, the round seals", state(OPEN0, m("a", 0), m("b", 0)), "a", 2.0, None,
     Seal(OPEN0, {"a": 0, "b": 1})),
    ("at max the round seals at once", state(OPEN0, m("a", 0), m("b", 0), m("c", 0)), "c", 0.0, None,
     Seal(OPEN0, {"a": 0, "b": 1, "c": 2})),
    ("a member of the sealed round has joined it", state(SEALED0, m("a", 0), m("b", 0)), "b", 0, None,
     Joined(SEALED0, 1)),
    ("the round an agent trained in is not joined again", state(SEALED0, m("a", 0), m("b", 0)), "b", 0, 0,
     Target(1)),
    ("a late joiner targets the next round", state(SEALED0, m("a", 0), m("b", 0)), "c", 0, None, Target(1)),
    ("a joiner ends a sealed round none of whose members is alive", state(SEALED0, m("c", 1)), "c", 0, None,
     EndDeadRound(SEALED0)),
    ("a round whose only member left finished is not dead: the sealer ends it on the other one's loss",
     state(SEALED0, m("c", 1), departed={"a": Departure("Finished", 0)}), "c", 0, None,
     EndRound(SEALED0, Change(MEMBER_LOST, member="b"))),
    ("the sealer waiting outside the round ends it on a member's loss", state(SEALED0, m("a", 0), m("c", 1)), "c", 0,
     None, EndRound(SEALED0, Change(MEMBER_LOST, member="b"))),
    # A member that is not the sealer sees only its own key and its own bucket of ranks (docs/design.md §3.19).
    ("a member waits for the sealer to seal, however many gathered",
     follower(state(OPEN0, m("a", 0), m("b", 0), m("c", 0))), "c", 0.0, None, Wait(None)),
    ("a member ends no dead round: it cannot see one", follower(state(SEALED0, m("c", 1))), "c", 0, None, Wait(None)),
    ("a member finds its rank in its bucket", follower(state(Round(0, sealed=True, members={"b": 1}, size=2),
                                                             m("b", 0))), "b", 0, None,
     Joined(Round(0, sealed=True, members={"b": 1}, size=2), 1)),
    ("a late joiner already waiting just waits", follower(state(SEALED0, m("a", 0), m("b", 0), m("c", 1))), "c", 0,
     None, Wait(None)),
    ("the sealer waiting as a late joiner below max ends the round to grow it",
     state(SEALED0, m("a", 0), m("b", 0), m("c", 1)), "c", 0, None, EndRound(SEALED0, Change(SCALE_UP, waiting=1))),
]


@pytest.mark.parametrize(("st", "me", "quiet", "after", "expected"), [c[1:] for c in JOIN_CASES],
                         ids=[c[0] for c in JOIN_CASES])
def test_join_step(st, me, quiet, after, expected) -> None:
    assert join_step(st, me, SETTINGS, quiet, after) == expected


AFTER_FAILURE_CASES = [
    ("every member heard from is back: seal at once, the silent one is not waited for",
     state(AFTER_FAILURE, m("a", 1), m("b", 1), m("c", 0)), "a", 0.0,
     Seal(AFTER_FAILURE, {"a": 0, "b": 1})),
    ("a member heard from is in without writing its key again: the sealer seals as the round opens",
     state(AFTER_FAILURE, m("a", 0), m("b", 0), m("c", 0)), "a", 0.0, Seal(AFTER_FAILURE, {"a": 0, "b": 1})),
    ("a member heard from that wrote its key again all the same is in once",
     state(AFTER_FAILURE, m("a", 1), m("b", 0), m("c", 0)), "a", 0.0, Seal(AFTER_FAILURE, {"a": 0, "b": 1})),
    ("a member expected back waits for the sealer without writing its key",
     follower(state(AFTER_FAILURE, m("b", 0))), "b", 0.0, Wait(None)),
    ("a member the round does not expect (silent through the incident) writes its key to join it",
     follower(state(AFTER_FAILURE, m("c", 0))), "c", 0.0, Target(1)),
    ("a member heard from whose key is gone (it gave up) is not waited for",
     state(AFTER_FAILURE, m("a", 1)), "a", 0.0, Seal(AFTER_FAILURE, {"a": 0})),
    ("a newcomer already waiting joins the same round",
     state(AFTER_FAILURE, m("a", 1), m("b", 1), m("d", 1, joined_at=5.0)), "d", 0.0,
     Seal(AFTER_FAILURE, {"a": 0, "b": 1, "d": 2})),
]


@pytest.mark.parametrize(("st", "me", "quiet", "expected"), [c[1:] for c in AFTER_FAILURE_CASES],
                         ids=[c[0] for c in AFTER_FAILURE_CASES])
def test_join_step_after_a_failure(st, me, quiet, expected) -> None:
    assert join_step(st, me, SETTINGS_1, quiet, 0) == expected


def test_below_min_the_members_expected_back_wait_for_more_like_any_others() -> None:
    st = state(AFTER_FAILURE, m("a", 0), m("b", 0))
    assert join_step(st, "a", Settings(min_nodes=3, max_nodes=4, last_call_seconds=2.0), 60.0, 0) == Wait(None)
    assert join_step(dataclasses.replace(st, members={**st.members, "n": m("n", 1)}), "a",
                     Settings(min_nodes=3, max_nodes=4, last_call_seconds=2.0), 0.0, 0) == Seal(
        AFTER_FAILURE, {"a": 0, "b": 1, "n": 2}), "a newcomer brings it to min: who was expected is in, no last call"


def test_survivors_keep_their_order_and_newcomers_follow_by_arrival() -> None:
    reopened = Round(4, previous={"old1": 1, "old0": 0, "gone": 2})
    st = state(reopened, m("new-early", 4, joined_at=1.0), m("old1", 4), m("new-late", 4, joined_at=2.0), m("old0", 4))
    step = join_step(st, "old1", Settings(1, 3, 0.0), 0.0, None)
    assert isinstance(step, Seal)
    assert step.ranks == {"old0": 0, "old1": 1, "new-early": 2}, "beyond max, the latest arrival waits"


CHANGE_CASES = [
    ("a healthy round needs no change", state(SEALED0, m("a", 0), m("b", 0)), None),
    ("a closed job makes every agent re-rendezvous (and exit)",
     state(SEALED0, m("a", 0), m("b", 0), closed=Closed("FailJobRule", "x")), Change("Closed")),
    ("a round ended by someone else only asks to re-join", state(Round(1), m("a", 0), m("b", 1)),
     Change(ROUND_ENDED)),
    ("a member whose lease went is lost", state(SEALED0, m("a", 0)), Change(MEMBER_LOST, member="b")),
    ("a member that finished is not lost", state(SEALED0, m("a", 0), departed={"b": Departure("Finished", 0)}), None),
    ("a stopped member is a departure with its reason",
     state(SEALED0, m("a", 0), departed={"b": Departure("Preempted", 0)}), Change("Preempted", member="b")),
    ("a waiting joiner below max is a scale-up", state(SEALED0, m("a", 0), m("b", 0), m("c", 1)),
     Change(SCALE_UP, waiting=1)),
    ("every lease lapsing together is a store outage, not a lost node", state(SEALED0),
     Change(STORE_UNAVAILABLE)),
    ("every lease lapsing together with a joiner waiting is still a store outage", state(SEALED0, m("c", 1)),
     Change(STORE_UNAVAILABLE)),
    ("a member that is not the sealer leaves a loss to the sealer", follower(state(SEALED0, m("a", 0))), None),
    ("a member that is not the sealer still sees its round end", follower(state(Round(1), m("a", 0))),
     Change(ROUND_ENDED)),
    ("a waiting joiner at max waits unseen (no restart loop)",
     state(Round(0, sealed=True, members={"a": 0, "b": 1, "c": 2}), m("a", 0), m("b", 0), m("c", 0), m("d", 1)),
     None),
]


@pytest.mark.parametrize(("st", "expected"), [c[1:] for c in CHANGE_CASES], ids=[c[0] for c in CHANGE_CASES])
def test_membership_change(st, expected) -> None:
    assert membership_change(st, joined_round=0, settings=SETTINGS) == expected


def test_all_finished_only_when_every_member_departed_finished() -> None:
    done = {"a": Departure("Finished", 0), "b": Departure("Finished", 0)}
    assert all_finished(state(SEALED0, departed=done))
    assert not all_finished(state(SEALED0, m("b", 0), departed={"a": done["a"]}))
    assert not all_finished(state(SEALED0, departed={"a": done["a"], "b": Departure("Preempted", 0)}))


BUDGET_CASES = [
    ("a first incident charges one", Budget(2), Charge(0, "WorkerFailure", "x"), 1, False),
    ("the same round twice charges once", Budget(2, 1, (Charge(0, "WorkerFailure", "x"),)),
     Charge(0, "MemberLost", "y"), 1, False),
    ("charging past max exceeds the budget", Budget(1, 1, (Charge(0, "WorkerFailure", "x"),)),
     Charge(1, "WorkerFailure", "y"), 2, True),
    ("a zero budget is exceeded by the first incident", Budget(0), Charge(3, "MemberLost", "z"), 1, True),
]

LOST_A = Charge(4, "MemberLost", "NodeLost of worker a", member="a")
AMEND_CASES = [
    ("the lost member's own crash report amends its loss", LOST_A,
     Charge(4, "WorkerFailure", "exit code 137 of worker a", 137, "a"), True),
    ("another member's report keeps the loss", LOST_A, Charge(4, "WorkerFailure", "exit 1 of b", 1, "b"), False),
    ("a report of another round is a charge of its own", LOST_A, Charge(5, "WorkerFailure", "x", 1, "a"), None),
    ("a worker failure already charged is kept", Charge(4, "WorkerFailure", "exit 1 of a", 1, "a"),
     Charge(4, "WorkerFailure", "exit 137 of a", 137, "a"), False),
    ("a crash names a loss that named nobody", Charge(4, "MemberLost", "lost"), Charge(4, "WorkerFailure", "x", 1, "a"),
     True),
    ("a report naming nobody amends nothing", Charge(4, "MemberLost", "lost"), Charge(4, "WorkerFailure", "x", 1),
     False),
]


@pytest.mark.parametrize(("first", "later", "replaced"), [c[1:] for c in AMEND_CASES], ids=[c[0] for c in AMEND_CASES])
def test_a_charge_of_the_same_round_amends_a_loss_only_with_a_crash_of_the_lost_member(first, later, replaced) -> None:
    after = charge(charge(Budget(3), first), later)
    if replaced is None:
        assert after.used == 2 and after.charges == (first, later)
    else:
        assert after.used == 1, "one incident, one charge, whoever names it"
        assert after.charges == ((later,) if replaced else (first,))


@pytest.mark.parametrize(("budget", "incident", "used", "exceeded"), [c[1:] for c in BUDGET_CASES],
                         ids=[c[0] for c in BUDGET_CASES])
def test_budget_charge(budget, incident, used, exceeded) -> None:
    after = charge(budget, incident)
    assert (after.used, after.exceeded) == (used, exceeded)
    assert decode_budget("budget", dumps(after.to_json())) == after


def test_exhausted_message_names_budget_and_last_incident() -> None:
    spent = charge(charge(Budget(1), Charge(0, "WorkerFailure", "exit code 137")), Charge(2, "MemberLost", "node n2"))
    assert exhausted_message(spent) == (
        "restart budget spent: 2 failure(s) > maxRestarts 1; last: round 2, MemberLost: node n2"
    )


def test_a_round_that_reaches_the_desired_size_seals_at_once() -> None:
    """Scale-up without waiting (issue 21): desired 3 of max 4, all three gathered, no last call waited."""
    job = parse_job({"apiVersion": "elastic.dev/v1alpha1", "kind": "ElasticJob", "metadata": {"name": "j"},
                     "spec": {"minReplicas": 1, "maxReplicas": 4, "replicas": 3,
                              "worker": {"command": ["python", "t.py"]}}})  # fmt: skip
    settings = Settings(min_nodes=1, max_nodes=4, last_call_seconds=2.0)
    three = JobState(round=OPEN0, members={i: m(i, 0) for i in "abc"}, spec=job)
    assert join_step(three, "a", settings, 0.0, None) == Seal(OPEN0, {"a": 0, "b": 1, "c": 2})
    two = JobState(round=OPEN0, members={i: m(i, 0) for i in "ab"}, spec=job)
    assert join_step(two, "a", settings, 0.0, None) == Wait(2.0), "below the desired size the last call holds"


SPARE_SETTINGS = Settings(min_nodes=1, max_nodes=3, last_call_seconds=2.0, spares=1)
SEALED_AT_TWO = Round(0, sealed=True, members={"a": 0, "b": 1})


def test_a_round_takes_the_desired_size_and_leaves_a_spare_out() -> None:
    """Hot spares (docs/design.md §3.18): max 3 less 1 spare seals at 2 at once; the third waits outside."""
    three = JobState(round=OPEN0, members={i: m(i, 0, joined_at=n) for n, i in enumerate("abc")})
    assert join_step(three, "c", SPARE_SETTINGS, 0.0, None) == Seal(OPEN0, {"a": 0, "b": 1})
    spare_state = JobState(round=SEALED_AT_TWO, members={"a": m("a", 0), "b": m("b", 0), "c": m("c", 0)})
    assert join_step(spare_state, "c", SPARE_SETTINGS, 0.0, None) == Target(1), "the spare waits for the next round"


def test_a_spare_waiting_is_no_scale_up_but_a_member_short_is() -> None:
    waiting = JobState(round=SEALED_AT_TWO, members={"a": m("a", 0), "b": m("b", 0), "c": m("c", 1)})
    assert membership_change(waiting, 0, SPARE_SETTINGS) is None
    assert spares_waiting(waiting) == 1
    grown = Settings(min_nodes=1, max_nodes=3, last_call_seconds=2.0)  # no spare wanted: it is growth
    assert membership_change(waiting, 0, grown) == Change(RoundEnd.SCALE_UP, waiting=1)


def test_the_round_a_lost_member_ends_takes_the_spare_in_at_once() -> None:
    after_loss = Round(1, previous={"a": 0, "b": 1}, opened_by="MemberLost", expected=("a",))
    back = JobState(round=after_loss, members={"a": m("a", 1), "c": m("c", 1, joined_at=5.0)})
    assert join_step(back, "c", SPARE_SETTINGS, 0.0, None) == Seal(after_loss, {"a": 0, "c": 1})


def test_a_member_whose_workers_finished_is_not_expected_back() -> None:
    keys = JobKeys("default", "j")
    sealed = Round(3, sealed=True, members={"a": 0, "b": 1, "c": 2}, mod_revision=7)
    state = JobState(round=sealed, members={i: m(i, 3) for i in "abc"}, job_lease=1, done={"b": 3, "c": 2})
    plan = plan_round_end(keys, state, sealed, incident_of(RoundEnd.MEMBER_LOST, None), 100.0)
    written = [json.loads(op.value) for op in plan.ops if getattr(op, "key", "").startswith(keys.ranks_prefix)]
    assert sorted(e for record in written for e in record.get("expected", [])) == ["a", "c"], \
        "b finished in this round (its agent is leaving); c's done is of an older round"


def test_a_scale_up_expects_every_member_and_newcomer_so_it_seals_without_the_last_call() -> None:
    keys = JobKeys("default", "j")
    sealed = Round(3, sealed=True, members={"a": 0, "b": 1}, mod_revision=7)
    state = JobState(round=sealed, members={"a": m("a", 3), "b": m("b", 3), "n": m("n", 4)}, job_lease=1)
    plan = plan_round_end(keys, state, sealed, incident_of(RoundEnd.SCALE_UP, None), 100.0)
    following = next(op for op in plan.ops if getattr(op, "key", None) == keys.round)
    buckets = {bucket_of(i) for i in "abn"}
    assert json.loads(following.value) == {"round": 4, "sealed": False, "opened_by": "ScaleUp", "opened_at": 100.0,
                                           "rank_buckets": bucket_mask(buckets)}, \
        "the round record stays small: who it expects is in the rank buckets, each member's in its own"
    written = {op.key: json.loads(op.value) for op in plan.ops if getattr(op, "key", "").startswith(keys.ranks_prefix)}
    assert set(written) == {keys.rank_bucket(b) for b in buckets}
    assert sorted(e for record in written.values() for e in record.get("expected", [])) == ["a", "b", "n"]
    assert {m: r for record in written.values() for m, r in record["ranks"].items()} == {"a": 0, "b": 1}, \
        "the buckets keep the ended round's ranks: the next round's survivors keep their order"
    assert all(record["round"] == 3 for record in written.values())
    after = Round(4, previous=sealed.members, opened_by="ScaleUp", expected=("a", "b", "n"))
    back = JobState(round=after, members={i: m(i, 4) for i in "abn"})
    assert join_step(back, "a", Settings(min_nodes=1, max_nodes=4, last_call_seconds=30.0), 0.0, None) == Seal(
        after, {"a": 0, "b": 1, "n": 2}), "everyone expected is in: no 30 s last call"


OWN_CRASH = Failure(137, member="a")
BROKEN_GROUP = Failure(None, reason=NODE_LOST)  # report_lost_peer: a peer vanished from our workers' group


@pytest.mark.parametrize(
    "seen, own, expected",
    [
        pytest.param(None, OWN_CRASH, None, id="nothing seen: our report decides"),
        pytest.param(Change(MEMBER_LOST, member="b"), None, Change(MEMBER_LOST, member="b"), id="no failure of ours"),
        pytest.param(Change(STORE_UNAVAILABLE), OWN_CRASH, None, id="a crash in an outage is the incident"),
        pytest.param(Change(STORE_UNAVAILABLE), BROKEN_GROUP, None, id="a broken group in an outage too"),
        pytest.param(Change(MEMBER_LOST, member="a"), OWN_CRASH, None, id="our lease lapsed with our crash"),
        pytest.param(Change(MEMBER_LOST, member="a"), BROKEN_GROUP, None, id="our lease lapsed, our group broke"),
        pytest.param(Change(MEMBER_LOST, member="a"), None, Change(MEMBER_LOST, member="a"),
                     id="our lease lapsed, nothing failed on our side"),
        pytest.param(Change(MEMBER_LOST, member="b"), OWN_CRASH, Change(MEMBER_LOST, member="b"),
                     id="a peer lost stands"),
        pytest.param(Change(RoundEnd.CLOSED), OWN_CRASH, Change(RoundEnd.CLOSED), id="a closed job stands"),
        pytest.param(Change(RoundEnd.PREEMPTED, member="b"), OWN_CRASH, Change(RoundEnd.PREEMPTED, member="b"),
                     id="a departure stands"),
    ],
)
def test_change_after_own_failure(seen, own, expected) -> None:
    assert change_after_own_failure(seen, own, member_id="a") == expected


@pytest.mark.parametrize(("sealer", "deposed"), [
    ("c", True),  # silent through the incident (a lost node whose lease still runs): the next round needs another
    ("a", False),  # heard from: it is coming back and seals the next round
    ("z", False),  # a spare outside the round: nothing says it is gone
])
def test_the_round_end_deposes_a_sealer_that_is_not_expected_back(sealer: str, deposed: bool) -> None:
    keys = JobKeys("default", "j")
    sealed = Round(3, sealed=True, members={"a": 0, "b": 1, "c": 2}, mod_revision=7)
    state = JobState(round=sealed, members={i: m(i, 3) for i in "abcz"}, alive=frozenset("ab"), sealer=sealer,
                     job_lease=1)
    plan = plan_round_end(keys, state, sealed, incident_of(RoundEnd.MEMBER_LOST, None), 100.0)
    assert (Delete(keys.sealer) in plan.ops) is deposed
