"""Which samples each rank reads (elastic.policy.sharding): once per epoch, whatever the world sizes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic.policy.sharding import Position, advance, epoch_order, epoch_steps, rank_span, readable

SPANS = [
    pytest.param(10, Position(0, 0), 2, 3, [(0, 3), (3, 6)], id="a full step: batch_size each, in rank order"),
    pytest.param(10, Position(0, 6), 2, 3, [(6, 8), (8, 10)], id="the last step splits what is left evenly"),
    pytest.param(10, Position(0, 9), 3, 4, [(9, 10), (10, 10), (10, 10)], id="fewer left than ranks: some read none"),
    pytest.param(11, Position(0, 4), 3, 4, [(4, 7), (7, 9), (9, 11)], id="uneven: the first ranks read one more"),
    pytest.param(100, Position(2, 40), 1, 8, [(40, 48)], id="one rank reads a whole step"),
]


@pytest.mark.parametrize(("length", "position", "world", "batch", "expected"), SPANS)
def test_rank_span(length: int, position: Position, world: int, batch: int, expected: list[tuple[int, int]]) -> None:
    assert [rank_span(length, position, world, batch, rank) for rank in range(world)] == expected


ADVANCES = [
    pytest.param(10, Position(0, 0), 2, 3, Position(0, 6), id="moves by world x batch"),
    pytest.param(10, Position(0, 6), 2, 3, Position(1, 0), id="the epoch's last step starts the next epoch"),
    pytest.param(12, Position(3, 6), 2, 3, Position(4, 0), id="an exact end starts the next epoch"),
    pytest.param(12, Position(0, 6), 1, 3, Position(0, 9), id="a smaller world moves by less"),
]


@pytest.mark.parametrize(("length", "position", "world", "batch", "expected"), ADVANCES)
def test_advance(length: int, position: Position, world: int, batch: int, expected: Position) -> None:
    assert advance(length, position, world, batch) == expected


def test_a_rank_outside_the_world_is_refused() -> None:
    with pytest.raises(ValueError, match="rank 2 outside a world of 2"):
        rank_span(10, Position(), 2, 3, 2)


def test_the_order_is_a_seeded_shuffle_per_epoch() -> None:
    first = epoch_order(50, seed=7, epoch=0)
    assert sorted(first) == list(range(50)) and first != list(range(50))
    assert epoch_order(50, seed=7, epoch=0) == first, "the same seed and epoch give the same order"
    assert epoch_order(50, seed=7, epoch=1) != first, "each epoch has its own order"
    assert epoch_order(50, seed=8, epoch=0) != first, "each seed has its own order"
    assert epoch_order(50, seed=7, epoch=0, shuffle=False) == list(range(50))


@settings(max_examples=300, deadline=None)
@given(
    length=st.integers(1, 200),
    batch=st.integers(1, 9),
    worlds=st.lists(st.integers(1, 8), min_size=1, max_size=60),
)
def test_every_sample_once_per_epoch_across_any_sequence_of_world_sizes(length: int, batch: int,
                                                                       worlds: list[int]) -> None:
    """Committed steps at any world sizes read each epoch's samples exactly once, each by one rank."""
    position, read = Position(), {}
    for world in worlds:
        order = epoch_order(length, 3, position.epoch)
        for rank in range(world):
            start, stop = rank_span(length, position, world, batch, rank)
            for index in order[start:stop]:
                assert (position.epoch, index) not in read, f"sample {index} read twice in epoch {position.epoch}"
                read[(position.epoch, index)] = rank
        position = advance(length, position, world, batch)
    for epoch in range(position.epoch):  # every finished epoch read the whole dataset
        assert {i for (e, i) in read if e == epoch} == set(range(length))
    assert len({i for (e, i) in read if e == position.epoch}) == position.consumed


READABLE = [
    pytest.param(10, Position(0, 8), 2, True, id="as many left as ranks: one each"),
    pytest.param(10, Position(0, 9), 2, False, id="fewer left than ranks: a rank would read none"),
    pytest.param(10, Position(0, 0), 11, False, id="a world larger than the dataset reads nothing"),
]


@pytest.mark.parametrize(("length", "position", "world", "expected"), READABLE)
def test_readable(length: int, position: Position, world: int, expected: bool) -> None:
    assert readable(length, position, world) is expected


EPOCH_STEPS = [
    pytest.param(10, Position(0, 0), 2, 3, [Position(0, 0), Position(0, 6)], id="to the epoch's end"),
    pytest.param(10, Position(0, 6), 2, 3, [Position(0, 6)], id="from the middle: what is left"),
    pytest.param(10, Position(0, 0), 3, 3, [Position(0, 0)], id="an unreadable tail (1 left, 3 ranks) is not a step"),
    pytest.param(10, Position(2, 9), 2, 3, [], id="nothing readable left: no step"),
]


@pytest.mark.parametrize(("length", "position", "world", "batch", "expected"), EPOCH_STEPS)
def test_epoch_steps(length: int, position: Position, world: int, batch: int, expected: list[Position]) -> None:
    assert epoch_steps(length, position, world, batch) == expected
