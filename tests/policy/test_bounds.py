"""Replica bounds and round sealing (docs/design.md §3.7)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elastic.policy.bounds import clamp_replicas, round_can_seal

CLAMP = [
    pytest.param(None, 1, 4, 4, id="unset desired means maxReplicas"),
    pytest.param(2, 1, 4, 2, id="desired inside the bounds is kept"),
    pytest.param(1, 1, 4, 1, id="desired at min is kept"),
    pytest.param(4, 1, 4, 4, id="desired at max is kept"),
    pytest.param(9, 1, 4, 4, id="desired above max is clamped to max"),
    pytest.param(1, 2, 4, 2, id="desired below min is clamped to min"),
    pytest.param(0, 2, 4, 2, id="desired 0 is clamped to min"),
    pytest.param(-3, 1, 4, 1, id="a negative desired is clamped to min"),
    pytest.param(7, 3, 3, 3, id="min equal to max pins the size"),
]


@pytest.mark.parametrize(("desired", "low", "high", "expected"), CLAMP)
def test_clamp_replicas(desired: int | None, low: int, high: int, expected: int) -> None:
    assert clamp_replicas(desired, low, high) == expected


@pytest.mark.parametrize(
    ("low", "high"),
    [pytest.param(3, 2, id="min above max is refused"), pytest.param(0, 2, id="min 0 is refused")],
)
def test_clamp_refuses_invalid_bounds(low: int, high: int) -> None:
    with pytest.raises(ValueError, match="1 <= min <= max"):
        clamp_replicas(1, low, high)


@given(st.none() | st.integers(-100, 100), st.integers(1, 20), st.integers(0, 20))
def test_clamp_always_lands_in_bounds(desired: int | None, low: int, extra: int) -> None:
    high = low + extra
    size = clamp_replicas(desired, low, high)
    assert low <= size <= high
    if desired is not None and low <= desired <= high:
        assert size == desired


SEAL = [
    # members, min, max, since last join, last call, can seal
    pytest.param(4, 1, 4, 0.0, 2.0, True, id="a full round seals at once"),
    pytest.param(5, 1, 4, 0.0, 2.0, True, id="a round above max seals at once"),
    pytest.param(2, 2, 4, 0.5, 2.0, False, id="a round at min waits for the last call"),
    pytest.param(2, 2, 4, 2.0, 2.0, True, id="a round at min seals when the last call has just passed"),
    pytest.param(3, 2, 4, 10.0, 2.0, True, id="a round between min and max seals after a quiet last call"),
    pytest.param(1, 2, 4, 600.0, 2.0, False, id="a round below min never seals"),
    pytest.param(0, 1, 4, 600.0, 0.0, False, id="an empty round never seals"),
    pytest.param(1, 1, 4, 0.0, 0.0, True, id="lastCallSeconds 0 seals at min at once"),
    pytest.param(3, 3, 3, 0.0, 30.0, True, id="min equal to max seals as soon as it is full"),
]  # fmt: skip

SEAL_AFTER_FAILURE = [
    # members, min, max, since last join, last call, stragglers, can seal
    pytest.param(1, 1, 4, 0.0, 2.0, 0, True, id="every member expected back is back: no last call"),
    pytest.param(1, 1, 4, 0.5, 2.0, 1, False, id="a member expected back is still missing: wait"),
    pytest.param(1, 1, 4, 2.0, 2.0, 1, True, id="the last call still ends the wait for a missing one"),
    pytest.param(1, 2, 4, 0.0, 2.0, 0, False, id="all back but below min: never"),
    pytest.param(1, 1, 4, 0.0, 2.0, None, False, id="nobody expected by name: the last call as usual"),
]  # fmt: skip


@pytest.mark.parametrize(("members", "low", "high", "quiet", "last_call", "expected"), SEAL)
def test_round_can_seal(members: int, low: int, high: int, quiet: float, last_call: float, expected: bool) -> None:
    assert round_can_seal(members, low, high, quiet, last_call) is expected


@pytest.mark.parametrize(("members", "low", "high", "quiet", "last_call", "stragglers", "expected"),
                         SEAL_AFTER_FAILURE)
def test_round_after_a_failure_seals_once_the_expected_are_back(
    members: int, low: int, high: int, quiet: float, last_call: float, stragglers: int | None, expected: bool
) -> None:
    assert round_can_seal(members, low, high, quiet, last_call, stragglers) is expected
