"""`ElasticSampler`: every sample of an epoch read once, by one rank, across any change of world size.

    sampler = ElasticSampler(len(dataset), batch_size=32, seed=0)
    session = Session(state={"model": model, "optimizer": optimizer, "sampler": sampler})
    with session:
        for step in session.steps(total):
            batch = [dataset[i] for i in sampler.indices(session.rank, session.world_size)]
            ...
            if session.allreduce_gradients(model):
                optimizer.step()
                session.commit()       # moves the sampler on by what the whole job read at this step

The sampler holds the job's position in its data (`elastic.policy.sharding`): registered with the
session, it moves only when a step is committed (the commit gate: every rank or none), travels with the
model to a replacement or newcomer, and is in `session.state_dict()` for a checkpoint, so restart mode and
stock torchrun resume at the committed position too.
"""

from __future__ import annotations

from typing import Any

from elastic.policy.sharding import Position, advance, epoch_order, rank_span, readable, step_size


class ElasticSampler:
    """Sample indices per (rank, world size) for the next step; see the module docstring.

    `length`: the dataset's size (indexable datasets). `batch_size`: samples per rank per step (the last step
    of an epoch reads what is left, split as evenly as possible). `seed` and `shuffle`: the epoch's order.
    """

    def __init__(self, length: int, batch_size: int, *, seed: int = 0, shuffle: bool = True) -> None:
        if length < 1:
            raise ValueError(f"ElasticSampler: length must be at least 1 (got {length}): an empty dataset")
        if batch_size < 1:
            raise ValueError(f"ElasticSampler: batch_size must be at least 1 (got {batch_size})")
        self.length = length
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.position = Position()
        self._order: tuple[int, list[int]] | None = None  # (epoch, order): computed once per epoch

    @property
    def epoch(self) -> int:
        return self.position.epoch

    def indices(self, rank: int, world_size: int) -> list[int]:
        """The dataset indices `rank` reads at the next step in a world of `world_size`."""
        return self.indices_at(self.position, rank, world_size)

    def indices_at(self, position: Position, rank: int, world_size: int) -> list[int]:
        """The dataset indices `rank` reads at the step at `position` in a world of `world_size`."""
        start, stop = rank_span(self.length, position, world_size, self.batch_size, rank)
        return self._epoch_order(position.epoch)[start:stop]

    def step_samples(self, world_size: int) -> int:
        """Samples the whole job reads at the next step in a world of `world_size`: what a loss summed over a
        rank's samples is divided by (times the world size, which the gradient average divides by again), so
        the step's gradient is the mean over the job's samples even when the ranks read unequal parts."""
        return step_size(self.length, self.position, world_size, self.batch_size)

    def advance(self, world_size: int) -> None:
        """A step at `world_size` was committed (the session calls this from `commit`)."""
        self.position = advance(self.length, self.position, world_size, self.batch_size)

    def start_epoch(self, epoch: int) -> None:
        """The script asks for `epoch` (`set_epoch`): a later epoch than the position's starts it from its first
        sample; the position's own epoch, or an earlier one, leaves the position as it is (a replacement's loop
        asks for the epoch its survivors are in the middle of)."""
        if epoch > self.position.epoch:
            self.position = Position(epoch, 0)

    def end_unreadable_epoch(self, world_size: int) -> None:
        """Move to the next epoch when fewer samples are left than ranks (`elastic.policy.sharding.readable`):
        the same on every rank, since it depends on the committed position and the round's size only."""
        if not readable(self.length, self.position, world_size):
            self.position = Position(self.position.epoch + 1, 0)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.position.epoch, "consumed": self.position.consumed, "length": self.length,
                "batch_size": self.batch_size, "seed": self.seed, "shuffle": self.shuffle}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take a peer's or a checkpoint's position; a different dataset or order is refused, not mixed."""
        for name in ("length", "batch_size", "seed", "shuffle"):
            if state.get(name) != getattr(self, name):
                raise ValueError(f"ElasticSampler: the saved state has {name}={state.get(name)!r}, this sampler "
                                 f"{getattr(self, name)!r}: the dataset or the sampler's arguments changed since "
                                 "it was saved; start the epoch afresh (a new checkpoint directory) or restore them")
        epoch, consumed = int(state["epoch"]), int(state["consumed"])
        if epoch < 0 or not 0 <= consumed < self.length:
            raise ValueError(f"ElasticSampler: the saved position (epoch {epoch}, consumed {consumed}) is outside "
                             f"a dataset of {self.length}")
        self.position = Position(epoch, consumed)

    def _epoch_order(self, epoch: int) -> list[int]:
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, epoch_order(self.length, self.seed, epoch, self.shuffle))
        return self._order[1]
