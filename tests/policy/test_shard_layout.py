"""Where ranks sit in an HSDP mesh after a membership change: survivors keep their shards (table-driven)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elastic.policy.shard_layout import LayoutError, ShardLayout, place

PLACES = [
    pytest.param([None, None, None, None], 2, (0, 1, 0, 1), id="first round: shards in rank order"),
    pytest.param([0, 0, 1, None], 2, (0, 0, 1, 1), id="rank 1 was replaced: survivors renumbered keep shards"),
    pytest.param([1, 0, None, None], 2, (1, 0, 0, 1), id="a scale-up by a replica: newcomers fill both shards"),
    pytest.param([None, 1, None, 0], 2, (0, 1, 1, 0), id="holders keep theirs, the others fill in rank order"),
    pytest.param([0, None], 1, (0, 0), id="shard size 1: plain replication"),
    pytest.param([None, None, None], 3, (0, 1, 2), id="one replica of 3"),
]


@pytest.mark.parametrize(("held", "shard_size", "expected"), PLACES)
def test_place(held: list[int | None], shard_size: int, expected: tuple[int, ...]) -> None:
    assert place(held, shard_size).shards == expected


REFUSED = [
    pytest.param([0, 1, None], 2, "not a multiple of the shard size 2", id="3 ranks, shards of 2"),
    pytest.param([0, 0, 0, 1], 2, "3 ranks hold shard 0", id="a survivor would change shards"),
    pytest.param([2, None], 2, "outside a shard size of 2", id="a shard index from another layout"),
    pytest.param([None], 0, "at least 1", id="shard size 0"),
]


@pytest.mark.parametrize(("held", "shard_size", "reason"), REFUSED)
def test_refused_with_the_reason(held: list[int | None], shard_size: int, reason: str) -> None:
    with pytest.raises(LayoutError, match=reason):
        place(held, shard_size)


def test_groups_of_a_2_by_2_layout() -> None:
    layout = ShardLayout(2, (1, 0, 0, 1))
    assert layout.replicate_groups() == [[1, 2], [0, 3]]  # by shard: its ranks in rank order, replica order
    assert layout.shard_groups() == [[1, 0], [2, 3]]  # by replica: its ranks in shard order
    assert [layout.replica(r) for r in range(4)] == [0, 0, 1, 1]
    assert layout.shard_group(3) == [2, 3]


@given(st.integers(1, 4), st.integers(1, 4), st.data())
def test_every_layout_is_whole_replicas_that_keep_their_holders(shard_size: int, replicas: int,
                                                               data: st.DataObject) -> None:
    world = shard_size * replicas
    held = data.draw(st.lists(st.one_of(st.none(), st.integers(0, shard_size - 1)), min_size=world, max_size=world))
    if any(held.count(s) > replicas for s in range(shard_size)):
        with pytest.raises(LayoutError):
            place(held, shard_size)
        return
    layout = place(held, shard_size)
    assert all(h is None or h == s for h, s in zip(held, layout.shards, strict=True))
    assert all(layout.shards.count(s) == replicas for s in range(shard_size))
    groups = layout.shard_groups()
    assert sorted(r for g in groups for r in g) == list(range(world))
    assert all([layout.shards[r] for r in g] == list(range(shard_size)) for g in groups)
