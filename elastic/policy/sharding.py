"""Which samples each rank reads at the next step, whatever the world size has been (pure).

A `DistributedSampler` splits an epoch by `rank`/`world_size` once: after a membership change the same
split no longer adds up, so samples are read twice or never, silently. Here an epoch is one order of the
dataset's indices (seeded, shuffled per epoch) and one position in it: how many samples the job's
committed steps have consumed. Each step reads the next `world_size x batch_size` positions, split between
the ranks in rank order; a committed step moves the position on by exactly what was read. The position is
part of the job's state (committed with the step, handed over with the model), so after any change of
world size the *remaining* positions are split across the new world: every sample of an epoch is read
once, by one rank, in the committed steps. Given the seed and the sequence of world sizes, the order and
the split are the same on every run.

The last step of an epoch reads what is left, split as evenly as possible (ranks differ by at most one
sample; with fewer samples left than ranks, some ranks read none at that step).
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Position:
    """Where the job is in its data: epoch, and samples of that epoch consumed by committed steps."""

    epoch: int = 0
    consumed: int = 0


def epoch_order(length: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """The order of the dataset's indices in `epoch`: the same on every rank and every run (the string seed
    is hashed by `random` itself, so PYTHONHASHSEED does not change it)."""
    order = list(range(length))
    if shuffle:
        random.Random(f"elastic-sampler:{seed}:{epoch}").shuffle(order)
    return order


def step_size(length: int, position: Position, world_size: int, batch_size: int) -> int:
    """Samples the whole job reads at the next step."""
    return min(world_size * batch_size, length - position.consumed)


def rank_span(length: int, position: Position, world_size: int, batch_size: int, rank: int) -> tuple[int, int]:
    """Positions [start, stop) of the epoch's order that `rank` reads at the next step."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside a world of {world_size}")
    base, extra = divmod(step_size(length, position, world_size, batch_size), world_size)
    start = position.consumed + rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def advance(length: int, position: Position, world_size: int, batch_size: int) -> Position:
    """The position after a committed step at `world_size`: a finished epoch starts the next one."""
    consumed = position.consumed + step_size(length, position, world_size, batch_size)
    return Position(position.epoch + 1, 0) if consumed >= length else Position(position.epoch, consumed)


def readable(length: int, position: Position, world_size: int) -> bool:
    """Whether every rank reads at least one sample at the next step. A DataLoader cannot yield an empty batch
    (a mean loss over none is NaN), so the loader (`elastic.train.DataLoader`) ends an epoch whose last
    samples are fewer than the ranks: at most world_size - 1 samples of it are never read (torch's
    DistributedSampler repeats samples to fill its last batch instead)."""
    return length - position.consumed >= world_size


def epoch_steps(length: int, position: Position, world_size: int, batch_size: int) -> list[Position]:
    """The positions of the epoch's steps still to read from `position` if the world stays `world_size`."""
    steps, epoch = [], position.epoch
    while position.epoch == epoch and readable(length, position, world_size):
        steps.append(position)
        position = advance(length, position, world_size, batch_size)
    return steps
