"""The drop-in calls' rules in one process (`elastic.train.distributed`, `loader`, `optimizer_gate`): a world
of one under no in-place agent (torch's own gloo group beneath the session). What they do across real
membership changes is `test_ddp_dropin.py`'s."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

import elastic.train as et


@pytest.fixture
def group() -> Iterator[et.Session]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    session = et.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield session
    et.destroy_process_group()


def dataset(size: int = 20) -> torch.utils.data.TensorDataset:
    inputs = torch.randn(size, 3, generator=torch.Generator().manual_seed(0))
    return torch.utils.data.TensorDataset(inputs, torch.arange(size) % 2)


def test_a_split_given_by_hand_is_refused() -> None:
    with pytest.raises(ValueError, match="num_replicas and rank"):
        et.DistributedSampler(dataset(), num_replicas=2, rank=0)


def test_the_loader_needs_the_process_group_first() -> None:
    with pytest.raises(RuntimeError, match=r"call elastic.train.init_process_group\(\) first"):
        et.DataLoader(dataset(), batch_size=4, sampler=et.DistributedSampler(dataset()))


def test_torchs_loader_cannot_read_the_elastic_sampler() -> None:
    loader = torch.utils.data.DataLoader(dataset(), batch_size=4, sampler=et.DistributedSampler(dataset()))
    with pytest.raises(TypeError, match=r"give it to elastic\.train\.DataLoader"):
        next(iter(loader))


def test_any_other_sampler_is_torchs_loader_unchanged() -> None:
    data = dataset()
    ours = [x for x, _ in et.DataLoader(data, batch_size=6)]
    torchs = [x for x, _ in torch.utils.data.DataLoader(data, batch_size=6)]
    assert len(ours) == 4 and all(torch.equal(a, b) for a, b in zip(ours, torchs, strict=True))


def test_shuffle_beside_the_sampler_is_refused(group: et.Session) -> None:
    with pytest.raises(ValueError, match="leave shuffle and batch_sampler unset"):
        et.DataLoader(dataset(), batch_size=4, shuffle=True, sampler=et.DistributedSampler(dataset()))


def test_a_pass_that_commits_nothing_ends_and_reads_the_epoch_once(group: et.Session) -> None:
    data = dataset(20)
    loader = et.DataLoader(data, batch_size=6, sampler=et.DistributedSampler(data, seed=3))
    seen = [int(i) for x, _ in loader for i in (x[:, :1] == data.tensors[0][:, :1].T).nonzero()[:, 1]]
    assert sorted(seen) == list(range(20)) and len(loader) == 4 and loader.batch_size == 6


def test_each_step_moves_the_loader_on_and_the_epoch_follows_the_job(group: et.Session) -> None:
    data = dataset(20)
    torch.manual_seed(0)
    model = et.DistributedDataParallel(torch.nn.Linear(3, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = et.DataLoader(data, batch_size=8, sampler=et.DistributedSampler(data))
    epochs = []
    for epoch in et.epochs(0, 2):
        loader.sampler.set_epoch(epoch)
        epochs.append(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
    assert epochs == [0, 1] and group.step == 6, "3 steps per epoch of 20 at 8, each counted once"
    assert group.state_dict()["objects"]["sampler"]["epoch"] == 2
    with pytest.raises(RuntimeError, match="a second optimizer"):
        torch.optim.SGD(model.parameters(), lr=0.1).step()


class DroppingSession:
    """A session whose gate drops every step (what a membership change does to the step that noticed it): the
    gate's own rule is under test, not a round's."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.joined, self.committed, self.state = model, True, 0, {}
        self.process_group = self

    def parameters(self) -> list[torch.nn.Parameter]:
        return list(self.model.parameters())

    def should_commit(self) -> bool:
        return False

    def register(self, name: str, obj: object) -> None:
        self.state[name] = obj

    def commit(self) -> None:
        self.committed += 1


def test_a_registered_scheduler_does_not_step_after_a_dropped_step() -> None:
    from elastic.train.optimizer_gate import OptimizerGate

    model = torch.nn.Linear(2, 1)
    session = DroppingSession(model)
    gate = OptimizerGate(session, join=lambda: session)  # type: ignore[arg-type]
    try:
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        gate.guard(scheduler)
        before = [p.detach().clone() for p in model.parameters()]
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        scheduler.step()
        assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True)), "step dropped"
        assert session.committed == 0 and scheduler.get_last_lr() == [1.0], "the schedule counts applied steps"
        session.should_commit = lambda: True  # type: ignore[method-assign]
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        scheduler.step()
        assert session.committed == 1 and scheduler.get_last_lr() == [0.5]
    finally:
        gate.remove()
