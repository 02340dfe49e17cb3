"""What a Session hands over and a checkpoint keeps: registered objects, the sampler's position, the RNGs.

No process group is needed to read or load the state: these run in this process. The round trip goes
through torch.save and torch.load(weights_only=True), the path a peer's state takes.
"""

from __future__ import annotations

import io
import random
from typing import Any

import numpy
import pytest
import torch
from torch import nn

from elastic.train import ElasticSampler, Session
from elastic.train.rng import rng_states, set_rng_states
from elastic.train.transfer import join, pack, split, unpack


def job() -> tuple[nn.Module, torch.optim.Optimizer, Any, ElasticSampler, torch.Tensor]:
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return model, optimizer, scheduler, ElasticSampler(100, 4, seed=1), torch.zeros((), dtype=torch.int64)


def session_of(parts: tuple[Any, ...]) -> Session:
    model, optimizer, scheduler, sampler, counter = parts
    return Session(state={"model": model, "optimizer": optimizer, "scheduler": scheduler, "sampler": sampler,
                          "counter": counter}, context=None)


def over_the_wire(state: dict[str, Any]) -> dict[str, Any]:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)


def train(parts: tuple[Any, ...], session: Session, steps: int, world_size: int) -> None:
    model, optimizer, scheduler, sampler, counter = parts
    for _ in range(steps):
        x = torch.tensor([sampler.indices(0, world_size)[:1] * 4], dtype=torch.float32)
        model(x).sum().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        counter += 1
        session.step += 1
        sampler.advance(world_size)


def test_a_receiver_gets_every_registered_object_the_step_and_the_rng() -> None:
    source_parts = job()
    source = session_of(source_parts)
    train(source_parts, source, steps=5, world_size=3)
    numpy.random.seed(5)
    random.seed(6)
    torch.manual_seed(7)
    sent = over_the_wire(source.state_dict())
    expected_draws = (torch.rand(3), random.random(), numpy.random.rand())

    receiver_parts = job()
    torch.manual_seed(0)  # the receiver's own generators are elsewhere
    random.seed(0)
    numpy.random.seed(0)
    receiver = session_of(receiver_parts)
    receiver.load_state_dict(sent)

    assert receiver.step == 5
    model, optimizer, scheduler, sampler, counter = receiver_parts
    for a, b in zip(model.parameters(), source_parts[0].parameters(), strict=True):
        assert torch.equal(a, b)
    assert optimizer.state_dict()["state"][0]["momentum_buffer"].equal(
        source_parts[1].state_dict()["state"][0]["momentum_buffer"])
    assert scheduler.get_last_lr() == source_parts[2].get_last_lr() == [0.025]
    assert sampler.position == source_parts[3].position and sampler.position.consumed == 5 * 3 * 4
    assert sampler.indices(1, 2) == source_parts[3].indices(1, 2)
    assert int(counter) == 5
    draws = (torch.rand(3), random.random(), numpy.random.rand())
    assert torch.equal(draws[0], expected_draws[0]) and draws[1:] == expected_draws[1:]


def test_rng_off_leaves_the_receivers_generators_alone() -> None:
    source = Session(state={"model": nn.Linear(2, 2)}, rng=False, context=None)
    assert "rng" not in source.state_dict()
    receiver = Session(state={"model": nn.Linear(2, 2)}, rng=False, context=None)
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    receiver.load_state_dict(over_the_wire(source.state_dict()))
    assert torch.equal(torch.rand(2), expected)


def test_callables_and_registered_objects_travel_together() -> None:
    weight = torch.ones(3)
    source = Session(lambda: {"w": weight.clone(), "note": "plain values too"}, lambda s: None,
                     state={"sampler": ElasticSampler(10, 2)}, context=None)
    received: list[dict[str, Any]] = []
    target = Session(lambda: {}, received.append, state={"sampler": ElasticSampler(10, 2)}, context=None)
    target.load_state_dict(over_the_wire(source.state_dict()))
    assert received[0]["note"] == "plain values too" and torch.equal(received[0]["w"], weight)


@pytest.mark.parametrize(
    ("registered", "message"),
    [
        pytest.param({"steps": 3}, r"state\['steps'\] is a int, which has no state_dict", id="a plain int"),
        pytest.param({"data": [1, 2]}, r"state\['data'\] is a list", id="a list"),
    ],
)
def test_registering_something_without_state_is_refused_by_name(registered: dict[str, Any], message: str) -> None:
    with pytest.raises(TypeError, match=message):
        Session(state=registered, context=None)


def test_half_a_pair_of_callables_is_refused() -> None:
    with pytest.raises(TypeError, match="go together"):
        Session(lambda: {}, context=None)


def test_a_checkpoint_without_a_registered_name_says_which() -> None:
    saved = Session(state={"model": nn.Linear(2, 2)}, context=None).state_dict()
    session = Session(state={"model": nn.Linear(2, 2), "sampler": ElasticSampler(10, 2)}, context=None)
    with pytest.raises(KeyError, match="no sampler"):
        session.load_state_dict(saved)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        pytest.param({"length": 11}, "length", id="another dataset size"),
        pytest.param({"batch_size": 3}, "batch_size", id="another batch size"),
        pytest.param({"seed": 9}, "seed", id="another seed"),
    ],
)
def test_a_sampler_refuses_a_position_saved_for_another_dataset(change: dict[str, int], field: str) -> None:
    saved = ElasticSampler(10, 2).state_dict() | change
    with pytest.raises(ValueError, match=f"saved state has {field}="):
        ElasticSampler(10, 2).load_state_dict(saved)


def test_a_sampler_refuses_a_position_outside_its_dataset() -> None:
    saved = ElasticSampler(10, 2).state_dict() | {"consumed": 10}
    with pytest.raises(ValueError, match="outside a dataset of 10"):
        ElasticSampler(10, 2).load_state_dict(saved)


@pytest.mark.parametrize(("length", "batch"), [(0, 2), (5, 0)])
def test_a_sampler_needs_samples_and_a_batch(length: int, batch: int) -> None:
    with pytest.raises(ValueError, match="must be at least 1"):
        ElasticSampler(length, batch)


def test_the_handover_format_keeps_every_tensor_and_value_without_serialising_tensors() -> None:
    """split/pack on the source, unpack/join on a receiver (the collectives between them carry the header
    and the buffer as they are): every dtype and shape comes back equal, views of one aligned buffer."""
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    state = {
        "model": {"w": torch.randn(5, 3), "b": torch.randn(3, dtype=torch.float64),
                  "mask": torch.tensor([True, False])},
        "step": torch.tensor(7), "empty": torch.empty(0, 2), "transposed": base.t(),
        "half": torch.ones(3, dtype=torch.half),
        "nested": [(torch.tensor([1, 2], dtype=torch.int64), "text", 3.5), None],
        "rng": {"python": (3, tuple(range(5)), None)},
        "generators": rng_states(),  # after other tensors: its views start at an offset into the buffer
    }
    skeleton, tensors = split(state)
    slots, buffer = pack(tensors)
    header = over_the_wire({"skeleton": skeleton, "slots": slots, "size": buffer.numel()})
    back = join(header["skeleton"], unpack(header["slots"], buffer.clone()))

    assert back["rng"] == state["rng"] and back["nested"][0][1:] == ("text", 3.5) and back["nested"][1] is None
    pairs = [(back["model"][k], state["model"][k]) for k in state["model"]]
    pairs += [(back[k], state[k]) for k in ("step", "empty", "transposed", "half")]
    pairs.append((back["nested"][0][0], state["nested"][0][0]))
    for got, sent in pairs:
        assert got.dtype == sent.dtype and got.shape == sent.shape and torch.equal(got, sent)
    assert all(slot["offset"] % 64 == 0 for slot in slots)
    assert len({t.untyped_storage().data_ptr() for t, _ in pairs if t.numel()}) == 1, "views of one buffer"
    expected = torch.rand(4)
    set_rng_states(back["generators"])  # a view at an offset: torch's own setter crashed on one
    assert torch.equal(torch.rand(4), expected)
