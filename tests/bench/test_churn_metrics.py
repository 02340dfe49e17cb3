"""bench/churn.py's arithmetic on made-up step lines: no agents, milliseconds.

Why: a goodput number is only as good as its counting. A restart that redoes steps must not count them
twice, steps lost from before the window must be subtracted, and the schedule must be the same for every
variant of a block (or the comparison is not fair).
"""

from __future__ import annotations

import math

from bench.agentjob import AgentStep
from bench.churn import Block, Line, committed_work, measure, median_step_seconds, schedule
from harness.agents import Step


def line(step: int, t: float, world_size: int = 2, generation: int = 1, job: int = 0) -> Line:
    return Line(job, AgentStep(0, generation, Step(step, 0.1, world_size, 0, t)))


def test_a_restart_from_a_checkpoint_counts_the_redone_steps_once() -> None:
    before = [line(n, float(n)) for n in range(1, 11)]  # steps 1-10 at t = 1..10
    after = [line(n, 15.0 + n, generation=2) for n in range(6, 16)]  # resumed from step 5: 6-15 at t = 21..30
    # the window is t in (0, 30]: the job's history holds steps 1-15, each once
    assert committed_work(before + after, 0.0, 30.0, 2) == 15
    # a window from t = 7, when the history was at step 7: it ends at step 15, so the window added 8
    # (steps 6-15 redone in it, less steps 6 and 7 which it lost from before it)
    assert committed_work(before + after, 7.0, 30.0, 2) == 8


def test_a_step_at_half_the_size_counts_half() -> None:
    lines = [line(n, float(n), world_size=2 if n <= 4 else 1) for n in range(1, 9)]
    assert committed_work(lines, 0.0, 10.0, 2) == 4 + 4 / 2


def test_median_step_time_ignores_the_gaps_between_rounds() -> None:
    lines = [line(n, n * 0.1) for n in range(1, 6)] + [line(n, 10 + n * 0.1, generation=2) for n in range(3, 9)]
    assert math.isclose(median_step_seconds(lines), 0.1)


def test_goodput_ideal_and_time_below_the_allowed_size() -> None:
    # 2 agents training at full size for 10 s, one step every 0.1 s; capacity 2 throughout, then a gap of 5 s
    lines = [line(n, n * 0.1) for n in range(1, 101)] + [line(n, 5.0 + n * 0.1) for n in range(101, 151)]
    row = Block("in-place", 0, 2, 20.0)
    measure(row, lines, 0.0, 20.0, [(0.0, 2)])
    assert math.isclose(row.goodput, 150 * 0.1 / 20, rel_tol=1e-6)
    assert math.isclose(row.ideal, 1.0)
    assert 4.5 <= row.below_s <= 5.5, row.below_s  # the 5 s gap
    row = Block("in-place", 0, 2, 20.0)
    measure(row, lines, 0.0, 20.0, [(0.0, 2), (10.0, 1), (15.0, 2)])  # one agent reclaimed 10-15 s
    assert math.isclose(row.ideal, 0.875)


def test_the_schedule_is_seeded_bounded_and_has_both_kinds_of_reclaim() -> None:
    events = schedule(1, 0, 120.0, 4)
    assert events == schedule(1, 0, 120.0, 4) and events != schedule(1, 1, 120.0, 4)
    assert len(events) >= 4 and all(0 < e.at < 120 for e in events)
    kinds = {e.kind for e in events}
    assert kinds == {"notice", "kill", "return"}, events
    reclaimed = 0
    for e in events:
        reclaimed += -1 if e.kind == "return" else 1
        assert 0 <= reclaimed <= 4 - 2, events  # never below 2 agents, never above 4
