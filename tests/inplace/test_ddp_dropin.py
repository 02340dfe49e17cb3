"""A stock DDP script, converted by its imports, survives in place (issue 45): `examples/ddp_tutorial/`.

`stock.py` is a script in the shape of PyTorch's DDP tutorial (DDP module, DataLoader over a
DistributedSampler, `loss.backward(); optimizer.step()`); `inplace.py` is the same script with four imports
and its epoch loop changed. Under in-place agents a worker crash and a scale-up keep the survivors'
processes, module, optimizer and DataLoader. Correctness that cannot pass by accident: rank 0 logs each
committed step (`ELASTIC_LOG_STEPS=1`: round, world size, data position), and the final parameters (float64)
must equal a fault-free replay of exactly those steps in one process, within `TOLERANCE`; the same replay
with one sample left out must miss them by more than 10x that. Real etcd, real agents, gloo on CPU.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F
from test_inplace_recovery import ROOT, in_place_job, worker_pid  # noqa: F401 (the fixture)

from elastic.policy.sharding import Position, advance, readable
from elastic.train.sampler import ElasticSampler
from harness.agents import wait_until

TUTORIAL = ROOT / "examples" / "ddp_tutorial"
COMMITTED = re.compile(r"committed step=(\d+) round=(\d+) world_size=(\d+) epoch=(\d+) consumed=(\d+)")
DONE = re.compile(r"^done rank=(\d+) batches=(\d+) pid=(\d+)$", re.M)
TOLERANCE = 1e-9  # float64: DDP's bucketed all-reduce and the replay's one-process sum differ in order only


def test_the_conversion_changes_ten_lines_at_most() -> None:
    stock, converted = ((TUTORIAL / name).read_text().splitlines() for name in ("stock.py", "inplace.py"))
    changed = [line for line in difflib.unified_diff(stock, converted, lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert 0 < len(changed) <= 10, "\n".join(changed)
    assert all("elastic" in line or "torch" in line or "epochs" in line for line in changed), changed


def tutorial() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ddp_tutorial_stock", TUTORIAL / "stock.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def committed_steps(output: str) -> list[tuple[int, Position]]:
    """(world size, data position) of each committed step, in order; each step logged once."""
    found = sorted((int(m[1]), int(m[3]), Position(int(m[4]), int(m[5]))) for m in COMMITTED.finditer(output))
    assert [step for step, _, _ in found] == list(range(len(found))), "every step logged once, none missing"
    return [(world, position) for _, world, position in found]


def replay(args: list[str], steps: list[tuple[int, Position]], skip: int | None = None) -> dict[str, torch.Tensor]:
    """The steps in one process: each rank's batch (the sampler's pure layout), the mean of the ranks' mean
    losses' gradients (what DDP averages), the script's own optimizer. `skip`: at that step, rank 0's first
    sample is not read."""
    saved_argv = sys.argv
    sys.argv = ["stock.py", *args]
    try:
        module = tutorial()
        namespace = module.parse_args()
    finally:
        sys.argv = saved_argv
    dataset, model, optimizer = module.load_train_objs(namespace)
    sampler = ElasticSampler(len(dataset), namespace.batch_size, seed=0)
    for index, (world, position) in enumerate(steps):
        optimizer.zero_grad()
        for rank in range(world):
            ids = sampler.indices_at(position, rank, world)[1 if index == skip and rank == 0 else 0 :]
            inputs, targets = dataset.inputs[ids], dataset.targets[ids]
            (F.cross_entropy(model(inputs), targets) / world).backward()
        optimizer.step()
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def expected_positions(length: int, batch_size: int, steps: list[tuple[int, Position]]) -> list[Position]:
    """The positions the loader must have read, from the logged world sizes alone (`elastic.policy.sharding`)."""
    position, positions = Position(), []
    for world, _ in steps:
        if not readable(length, position, world):
            position = Position(position.epoch + 1, 0)
        positions.append(position)
        position = advance(length, position, world, batch_size)
    return positions


def difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[name] - b[name]).abs().max()) for name in a)


def assert_replayed(job, args: list[str], final: Path, epochs: int, length: int, batch_size: int) -> list[int]:
    steps = committed_steps(job.output())
    assert [p for _, p in steps] == expected_positions(length, batch_size, steps), "the loader read the layout"
    assert steps[-1][1].epoch == epochs - 1 and advance(length, steps[-1][1], steps[-1][0], batch_size).epoch == epochs
    trained = torch.load(final, weights_only=True)
    assert difference(trained, replay(args, steps)) < TOLERANCE, "the final model is the fault-free replay's"
    skipped = replay(args, steps, skip=len(steps) // 2)
    assert difference(trained, skipped) > 10 * TOLERANCE, "one sample left out shows"
    return [world for world, _ in steps]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2], ids=["in-process-loading", "dataloader-workers-fetching-ahead"])
def test_a_worker_crash_is_survived_in_place_by_the_converted_tutorial(in_place_job, tmp_path, workers) -> None:  # noqa: F811
    epochs, length, batch_size = 3, 1024, 16
    args = [str(epochs), "1", "--batch_size", str(batch_size), "--dataset-size", str(length), "--dtype", "float64",
            "--num-workers", str(workers),
            "--snapshot-path", str(tmp_path / "snapshot.pt"), "--save-final", str(tmp_path / "final.pt"),
            "--crash-at-batch", "50", "--crash-marker", str(tmp_path / "crashed"), "--step-seconds", "0.03"]
    job = in_place_job("2:2", args, script=TUTORIAL / "inplace.py", env={"ELASTIC_LOG_STEPS": "1"})
    agents = [job.add_agent() for _ in range(2)]
    assert wait_until(lambda: len(COMMITTED.findall(job.output())) >= 5, 120), job.logs()
    pids = {agent.pid: worker_pid(agent) for agent in agents}  # training, before the crash at batch 50
    job.wait_finished(180)
    crashed = re.search(r"crashing rank=1 batch=50 pid=(\d+)", job.output())
    assert crashed, job.logs()
    done = {int(m[3]) for m in DONE.finditer(job.output())}
    assert len(done) == 2, job.logs()  # the crashed worker printed nothing; its replacement and the survivor did
    assert set(pids.values()) - {int(crashed[1])} < done, f"the survivor kept its process: {pids} {job.logs()}"
    worlds = assert_replayed(job, args, tmp_path / "final.pt", epochs, length, batch_size)
    assert set(worlds) == {2}
    budget = job.budget()
    assert budget["used"] == 1 and [c["reason"] for c in budget["charges"]] == ["WorkerFailure"], budget


@pytest.mark.slow
def test_a_newcomer_joins_the_converted_tutorial_mid_epoch_and_receives_its_state(in_place_job, tmp_path) -> None:  # noqa: F811
    # 288 steps of 0.06 s at world size 2: a newcomer's agent takes seconds to start and join, and with 192
    # steps of 0.03 s a loaded machine finished the run before it joined (its agent then found the run closed).
    epochs, length, batch_size = 6, 768, 8
    args = [str(epochs), "1", "--batch_size", str(batch_size), "--dataset-size", str(length), "--dtype", "float64",
            "--snapshot-path", str(tmp_path / "snapshot.pt"), "--save-final", str(tmp_path / "final.pt"),
            "--step-seconds", "0.06"]
    job = in_place_job("2:3", args, script=TUTORIAL / "inplace.py", env={"ELASTIC_LOG_STEPS": "1"})
    first = [job.add_agent() for _ in range(2)]
    assert wait_until(lambda: len(COMMITTED.findall(job.output())) >= 30, 120), job.logs()
    pids = {worker_pid(agent) for agent in first}
    job.add_agent()
    job.wait_finished(240)
    done = {int(m[3]) for m in DONE.finditer(job.output())}
    assert len(done) == 3 and pids < done, job.logs()
    worlds = assert_replayed(job, args, tmp_path / "final.pt", epochs, length, batch_size)
    assert worlds[0] == 2 and worlds[-1] == 3, "trained at 2, then at 3"
    assert job.budget()["used"] == 0, "a scale-up is free"
