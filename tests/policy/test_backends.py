"""Which groups an in-place round builds (elastic.policy.backends): gloo for control, the script's backend for
training, NCCL set up to be aborted rather than to tear the process down."""

from __future__ import annotations

import pytest

from elastic.policy.backends import GLOO, NCCL, group_plan, requested_training

REQUESTS = [
    pytest.param(None, None, id="unset: torch's default for the device"),
    pytest.param("gloo", GLOO, id="gloo"),
    pytest.param("NCCL", NCCL, id="a name in capitals"),
    pytest.param("cpu:gloo,cuda:nccl", NCCL, id="torch's per-device form: the GPUs' backend trains"),
    pytest.param("cpu:gloo", GLOO, id="per-device, CPU only"),
]


@pytest.mark.parametrize(("backend", "expected"), REQUESTS)
def test_requested_training(backend: str | None, expected: str | None) -> None:
    assert requested_training(backend) == expected


def test_a_backend_in_place_cannot_rebuild_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"backend='mpi'.*give backend='nccl' \(GPUs\), 'gloo' \(CPU\)"):
        requested_training("mpi")


PLANS = [
    # backend, cuda, nccl -> training, separate control, NCCL error handling, note mentions
    pytest.param("nccl", True, True, NCCL, True, "0", None, id="NCCL on GPUs: beside a gloo control group"),
    pytest.param(None, True, True, NCCL, True, "0", None, id="unset on GPUs: NCCL, as torch would"),
    pytest.param(None, False, False, GLOO, False, None, None, id="unset on CPUs: gloo alone"),
    pytest.param("gloo", True, True, GLOO, False, None, None, id="gloo asked for on GPUs: gloo"),
    pytest.param("nccl", False, False, GLOO, False, None, "no usable GPU", id="NCCL without a GPU: gloo, said"),
    pytest.param("nccl", True, False, GLOO, False, None, "without NCCL", id="a CPU build of torch: gloo, said"),
]


@pytest.mark.parametrize(("backend", "cuda", "nccl", "training", "separate", "handling", "note"), PLANS)
def test_group_plan(backend: str | None, cuda: bool, nccl: bool, training: str, separate: bool,
                    handling: str | None, note: str | None) -> None:
    plan = group_plan(backend, cuda, nccl, timeout_seconds=30.0)
    assert (plan.training, plan.separate_control) == (training, separate)
    assert plan.env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING") == handling
    assert plan.timeout_seconds == 30.0
    assert (note is None and plan.note is None) or (note is not None and note in (plan.note or ""))
