"""activeDeadlineSeconds (docs/design.md §3.8): the job fails once it has run that long."""

from __future__ import annotations

import pytest

from elastic.policy.deadline import deadline_exceeded, deadline_remaining

CASES = [
    # started_at, now, deadline, exceeded, remaining
    pytest.param(100.0, 150.0, None, False, None, id="no deadline is never exceeded"),
    pytest.param(None, 1e9, 60, False, None, id="a job that has not started has no deadline yet"),
    pytest.param(100.0, 159.5, 60, False, 0.5, id="half a second before the deadline is not exceeded"),
    pytest.param(100.0, 160.0, 60, True, 0.0, id="exactly at the deadline is exceeded"),
    pytest.param(100.0, 400.0, 60, True, -240.0, id="long after the deadline is exceeded"),
    pytest.param(100.0, 100.0, 1, False, 1.0, id="a fresh job has its whole deadline left"),
]  # fmt: skip


@pytest.mark.parametrize(("started", "now", "deadline", "exceeded", "remaining"), CASES)
def test_deadline(
    started: float | None, now: float, deadline: int | None, exceeded: bool, remaining: float | None
) -> None:
    assert deadline_exceeded(started, now, deadline) is exceeded
    assert deadline_remaining(started, now, deadline) == remaining
