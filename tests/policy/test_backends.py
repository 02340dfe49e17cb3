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
    # backend, GPUs, local ranks, NCCL built -> training, separate control, NCCL error handling, note mentions
    pytest.param("nccl", 2, 2, True, NCCL, True, "0", None, id="NCCL, a GPU per rank: beside a gloo control group"),
    pytest.param(None, 1, 1, True, NCCL, True, "0", None, id="unset on a GPU: NCCL, as torch would"),
    pytest.param(None, 0, 1, False, GLOO, False, None, None, id="unset on CPUs: gloo alone"),
    pytest.param(None, 1, 2, True, GLOO, False, None, None, id="unset, two ranks on one GPU: gloo"),
    pytest.param("gloo", 2, 2, True, GLOO, False, None, None, id="gloo asked for on GPUs: gloo"),
    pytest.param("nccl", 0, 1, False, GLOO, False, None, "no usable GPU", id="NCCL without a GPU: gloo, said"),
    pytest.param("nccl", 1, 1, False, GLOO, False, None, "without NCCL", id="a CPU build of torch: gloo, said"),
    pytest.param("nccl", 1, 2, True, GLOO, False, None, "1 GPU(s) for 2 local ranks", id="two ranks, one GPU"),
]


@pytest.mark.parametrize(("backend", "gpus", "local_ranks", "nccl", "training", "separate", "handling", "note"),
                         PLANS)
def test_group_plan(backend: str | None, gpus: int, local_ranks: int, nccl: bool, training: str, separate: bool,
                    handling: str | None, note: str | None) -> None:
    plan = group_plan(backend, gpus, local_ranks, nccl, timeout_seconds=30.0)
    assert (plan.training, plan.separate_control) == (training, separate)
    assert plan.env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING") == handling
    assert plan.timeout_seconds == 30.0
    assert (note is None and plan.note is None) or (note is not None and note in (plan.note or ""))
