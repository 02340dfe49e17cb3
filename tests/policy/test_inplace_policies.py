"""In-place recovery's decisions, table by table: the agent's next step, the state source, the step deadline."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elastic.policy.hang import (
    HangSettings,
    Verdict,
    abandon_after,
    frozen,
    runnable_elapsed,
    step_deadline,
    verdict,
)
from elastic.policy.inplace import (
    ABANDONED_EXIT,
    LOST_PEER_GRACE_SECONDS,
    Finish,
    Keep,
    Rejoin,
    Replace,
    ReportLostPeer,
    RestartAll,
    next_step,
)
from elastic.policy.state_source import NoSource, Report, transfer_plans
from elastic.train.context import Heartbeat

ALL = frozenset({0, 1})
NONE: frozenset[int] = frozenset()

NEXT_STEP = [
    pytest.param({0: None, 1: None}, ALL, False, Keep(), id="all running, nothing changed"),
    pytest.param({0: 0, 1: 0}, ALL, False, Finish(), id="all exited 0: finished"),
    pytest.param({0: 0, 1: None}, ALL, False, Keep(), id="one finished, one still running"),
    pytest.param({0: None, 1: 3}, ALL, False, Replace((1,), 3), id="a capable worker failed: replace it alone"),
    pytest.param({0: 1, 1: 3}, ALL, False, Replace((0, 1), 1), id="two failed: both replaced, lowest rank reported"),
    pytest.param({0: None, 1: 3}, frozenset({1}), False, RestartAll(3), id="a stock worker beside: restart all"),
    pytest.param({0: None, 1: 3}, NONE, True, RestartAll(3), id="stock script failed during a change"),
    pytest.param({0: None, 1: ABANDONED_EXIT}, ALL, False, Replace((1,), None), id="abandoned: free restart"),
    pytest.param({0: ABANDONED_EXIT, 1: 2}, ALL, False, Replace((0, 1), 2), id="abandoned beside a failure"),
    pytest.param({0: None, 1: None}, ALL, True, Rejoin(restart_all=False), id="round ended elsewhere: keep"),
    pytest.param({0: None, 1: None}, frozenset({0}), True, Rejoin(restart_all=True), id="change, stock worker"),
    pytest.param({0: 0, 1: None}, frozenset({1}), True, Rejoin(restart_all=False), id="change, finished one"),
]


LOST_PEER = [
    pytest.param(None, Keep(), id="no group broke"),
    pytest.param(LOST_PEER_GRACE_SECONDS / 2, Keep(), id="broke just now: the peer's own agent may report it"),
    pytest.param(LOST_PEER_GRACE_SECONDS, ReportLostPeer(), id="nobody reported within the grace: report it"),
]


@pytest.mark.parametrize(("broken_for", "expected"), LOST_PEER)
def test_a_broken_group_nobody_reports_is_reported_after_the_grace(broken_for: float | None, expected: object) -> None:
    assert next_step({0: None, 1: None}, ALL, False, broken_for) == expected


def test_a_change_or_an_exit_beats_a_lost_peer_report() -> None:
    assert next_step({0: None, 1: None}, ALL, True, 5.0) == Rejoin(restart_all=False)
    assert next_step({0: None, 1: 1}, ALL, False, 5.0) == Replace((1,), 1)


@pytest.mark.parametrize(("exits", "capable", "change", "expected"), NEXT_STEP)
def test_next_step(exits: dict[int, int | None], capable: frozenset[int], change: bool, expected: object) -> None:
    assert next_step(exits, capable, change) == expected


PLANS = [
    pytest.param([(10, True), (10, True)], 0, (), id="survivors agree: nothing moves"),
    pytest.param([(10, True), (0, False)], 0, (1,), id="a replacement receives from a survivor"),
    pytest.param([(0, False), (10, True), (10, True)], 1, (0,), id="rank 0 replaced: the lowest holder sends"),
    pytest.param([(9, True), (10, True)], 1, (0,), id="a step one survivor committed is kept, the other catches up"),
    pytest.param([(0, False), (0, False), (0, False)], 0, (1, 2), id="first round: rank 0's init to everyone"),
    pytest.param([(0, False), (40, False)], 1, (0,), id="first round: the newest loaded checkpoint wins"),
    pytest.param([(5, True), (40, False)], 0, (1,), id="held state beats a checkpoint a newcomer loaded"),
    pytest.param([(7, True)], 0, (), id="alone"),
]


@pytest.mark.parametrize(("reports", "source", "receivers"), PLANS)
def test_transfer_plan(reports: list[tuple[int, bool]], source: int, receivers: tuple[int, ...]) -> None:
    [plan] = transfer_plans([Report(*r) for r in reports])
    assert (plan.source, plan.receivers) == (source, receivers)


@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=1, max_size=8))
def test_after_a_plan_every_rank_holds_the_sources_step(reports: list[tuple[int, bool]]) -> None:
    [plan] = transfer_plans([Report(*r) for r in reports])
    best = reports[plan.source]
    for rank, (step, holds) in enumerate(reports):
        receives = rank in plan.receivers
        assert receives or rank == plan.source or (holds and best[1] and step == best[0])
    assert all(not (holds and step > best[0]) for step, holds in reports if best[1])


# HSDP, 2 shards: (step, holds, shard held) per rank, the shard each rank is placed on -> (source, receivers)
SHARDED_PLANS = [
    pytest.param([(9, True, 0), (9, True, 1), (9, True, 0), (9, True, 1)], [0, 1, 0, 1], [(0, ()), (1, ())],
                 id="2 x 2, nothing changed: nothing moves"),
    pytest.param([(9, True, 0), (9, True, 0), (9, True, 1), (0, False, 0)], [0, 0, 1, 1], [(0, ()), (2, (3,))],
                 id="a replacement on shard 1 receives from shard 1's survivor, not from rank 0"),
    pytest.param([(9, True, 1), (9, True, 0), (0, False, 0), (0, False, 0)], [1, 0, 0, 1], [(1, (2,)), (0, (3,))],
                 id="a scale-up by one replica: each newcomer from its own shard's holder"),
    pytest.param([(8, True, 0), (9, True, 0), (9, True, 1), (9, True, 1)], [0, 0, 1, 1], [(1, (0,)), (2, ())],
                 id="a laggard on shard 0 catches up from its shard's newest holder"),
    pytest.param([(0, False, 0), (0, False, 0), (0, False, 0), (0, False, 0)], [0, 1, 0, 1], [(0, (2,)), (1, (3,))],
                 id="first round: each shard's lowest rank to its replicas"),
]


@pytest.mark.parametrize(("reports", "placed", "expected"), SHARDED_PLANS)
def test_sharded_transfer_plans(reports: list[tuple[int, bool, int]], placed: list[int],
                                expected: list[tuple[int, tuple[int, ...]]]) -> None:
    plans = transfer_plans([Report(*r) for r in reports], placed)
    assert [(plan.source, plan.receivers) for plan in plans] == expected


@pytest.mark.parametrize(("reports", "placed"), [
    pytest.param([(9, True, 0), (0, False, 0)], [0, 1], id="shard 1's only holder is gone"),
    pytest.param([(9, True, 0), (8, True, 1), (9, True, 0), (8, True, 1)], [0, 1, 0, 1],
                 id="shard 0 at step 9, shard 1 at step 8: no step every shard has"),
])
def test_memory_cannot_heal(reports: list[tuple[int, bool, int]], placed: list[int]) -> None:
    with pytest.raises(NoSource):
        transfer_plans([Report(*r) for r in reports], placed)


SETTINGS = HangSettings(factor=10, floor_seconds=2, abandon_after_seconds=1, min_steps=3)

VERDICTS = [
    pytest.param(5.0, None, False, False, Verdict.CONTINUE, id="no median yet: never hung"),
    pytest.param(1.9, 2.0, False, False, Verdict.CONTINUE, id="inside the deadline"),
    pytest.param(2.1, 2.0, False, False, Verdict.HUNG, id="overdue outside a collective: this worker hangs"),
    pytest.param(99.0, 2.0, True, False, Verdict.CONTINUE, id="overdue in a collective, round holds: a victim"),
    pytest.param(0.5, 2.0, True, True, Verdict.CONTINUE, id="round ended: the collective may still fail itself"),
    pytest.param(1.5, 2.0, True, True, Verdict.ABANDON, id="round ended under a stuck collective: abandon"),
    pytest.param(1.5, None, True, True, Verdict.ABANDON, id="abandon needs no median"),
]


@pytest.mark.parametrize(("elapsed", "deadline", "in_collective", "round_over", "expected"), VERDICTS)
def test_verdict(
    elapsed: float, deadline: float | None, in_collective: bool, round_over: bool, expected: Verdict
) -> None:
    assert verdict(elapsed, deadline, in_collective, round_over, SETTINGS) is expected


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param([0.1, 0.1], None, id="fewer than min_steps"),
        pytest.param([0.1, 0.1, 0.1], 2.0, id="the floor when steps are fast"),
        pytest.param([0.5, 0.3, 9.0], 5.0, id="k x the median: one slow step does not move it"),
    ],
)
def test_step_deadline(steps: list[float], expected: float | None) -> None:
    assert step_deadline(steps, SETTINGS) == expected


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param([0.1, 0.1], 1.0, id="no median yet: the fixed grace"),
        pytest.param([0.1, 0.2, 0.1], 1.0, id="fast steps: the fixed grace"),
        pytest.param([0.9, 0.8, 1.2], 1.8, id="slow steps: two medians, so a big all-reduce may finish"),
    ],
)
def test_abandon_after(steps: list[float], expected: float) -> None:
    assert abandon_after(steps, SETTINGS) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("wall", "waited", "deadline", "expected"),
    [
        pytest.param(30.0, 25.0, 10.0, Verdict.CONTINUE, id="a step starved of CPU for most of its time is slow"),
        pytest.param(30.0, 0.0, 10.0, Verdict.HUNG, id="a deadlocked step waits for no CPU and hangs"),
        pytest.param(30.0, 15.0, 10.0, Verdict.HUNG, id="a step past its deadline in its own time hangs"),
        pytest.param(5.0, 9.0, 10.0, Verdict.CONTINUE, id="more waiting than wall is read as no time of its own"),
        pytest.param(30.0, -1.0, 10.0, Verdict.HUNG, id="no schedstats (nothing subtracted) is the wall clock"),
    ],
)
def test_a_step_is_judged_by_its_own_time_not_by_a_loaded_machines(
    wall: float, waited: float, deadline: float, expected: Verdict
) -> None:
    assert verdict(runnable_elapsed(wall, waited), deadline, False, False, SETTINGS) is expected


def test_a_collective_inside_a_long_grace_is_not_abandoned() -> None:
    assert verdict(1.5, None, True, True, SETTINGS, grace=1.8) is Verdict.CONTINUE


@pytest.mark.parametrize(
    ("kind", "since", "deadline", "state", "expected"),
    [
        pytest.param("step", 0.0, 2.0, "T", True, id="stopped in a step past its deadline: ended by its agent"),
        pytest.param("collective", 0.0, 2.0, "T", True, id="stopped in a collective past its deadline"),
        pytest.param("step", 0.0, 2.0, "D", True, id="in uninterruptible sleep past its deadline"),
        pytest.param("step", 9.0, 2.0, "T", False, id="stopped, but within its deadline"),
        pytest.param("collective", 0.0, 2.0, "S", False,
                     id="a victim waiting in a collective can run: its own watchdog decides, never killed"),
        pytest.param("step", 0.0, 2.0, "R", False, id="running past its deadline: its own watchdog acts"),
        pytest.param("idle", 0.0, 2.0, "T", False, id="idle between rounds: no deadline applies"),
        pytest.param("step", 0.0, None, "T", False, id="no deadline known yet (first steps)"),
        pytest.param("step", 0.0, 2.0, None, False, id="gone from the process table"),
    ],
)  # fmt: skip
def test_a_worker_that_cannot_run_is_ended_by_its_agent(kind, since, deadline, state, expected) -> None:
    assert frozen(kind, since, deadline, 10.0, state) is expected


def test_a_heartbeat_is_read_as_written_and_a_torn_write_is_skipped(tmp_path) -> None:
    writer = Heartbeat(Heartbeat.path(tmp_path, 0), create=True)
    reader = Heartbeat(Heartbeat.path(tmp_path, 0))
    assert reader.read() is None, "nothing written yet"
    writer.write("step", 12.5, 2.0)
    assert reader.read() == ("step", 12.5, 2.0)
    writer.write("collective", 13.0, None)
    assert reader.read() == ("collective", 13.0, None)
    struct.pack_into("=Q", writer._map, 0, 7)  # a write under way (odd sequence)
    assert reader.read() is None
