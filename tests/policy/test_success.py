"""Success policy (docs/design.md §3.6): AllWorkers waits for every rank; Rank0 trusts the chief and stops the rest."""

from __future__ import annotations

import pytest

from elastic.policy.success import SuccessOutcome, decide_success
from elastic.spec import SuccessPolicy

ALL, RANK0 = SuccessPolicy.ALL_WORKERS, SuccessPolicy.RANK0

CASES = [
    pytest.param(ALL, {0: 0, 1: 0, 2: 0}, SuccessOutcome(True, ()), id="AllWorkers succeeds when every rank exited 0"),
    pytest.param(ALL, {0: 0, 1: None}, SuccessOutcome(False, ()), id="AllWorkers waits while a rank still runs"),
    pytest.param(ALL, {0: 0, 1: 1}, SuccessOutcome(False, ()), id="AllWorkers does not succeed when a rank failed"),
    pytest.param(ALL, {0: None, 1: 0}, SuccessOutcome(False, ()), id="AllWorkers waits for rank 0 too"),
    pytest.param(ALL, {}, SuccessOutcome(False, ()), id="an empty world has not succeeded"),
    pytest.param(
        RANK0, {0: 0, 1: None, 2: 0, 3: None}, SuccessOutcome(True, (1, 3)),
        id="Rank0 succeeds when rank 0 exited 0 and stops the ranks still running",
    ),
    pytest.param(RANK0, {0: 0, 1: 0}, SuccessOutcome(True, ()), id="Rank0 stops nothing when all have exited"),
    pytest.param(
        RANK0, {3: None, 0: 0, 1: None}, SuccessOutcome(True, (1, 3)), id="Rank0 lists ranks to stop in order"
    ),
    pytest.param(
        RANK0, {0: 0, 1: 1, 2: None}, SuccessOutcome(True, (2,)),
        id="Rank0 succeeds even if another rank already failed",
    ),
    pytest.param(RANK0, {0: None, 1: 0}, SuccessOutcome(False, ()), id="Rank0 waits while rank 0 still runs"),
    pytest.param(RANK0, {0: 1, 1: None}, SuccessOutcome(False, ()), id="Rank0 does not succeed when rank 0 failed"),
    pytest.param(RANK0, {1: 0, 2: 0}, SuccessOutcome(False, ()), id="Rank0 does not succeed without a rank 0"),
    pytest.param("Rank0", {0: 0, 1: None}, SuccessOutcome(True, (1,)), id="the policy may be given as its string"),
]  # fmt: skip


@pytest.mark.parametrize(("policy", "world", "expected"), CASES)
def test_decide_success(policy: SuccessPolicy | str, world: dict[int, int | None], expected: SuccessOutcome) -> None:
    assert decide_success(policy, world) == expected


def test_an_unknown_policy_is_an_error() -> None:
    with pytest.raises(ValueError):
        decide_success("Chief", {0: 0})
