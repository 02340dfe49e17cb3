"""torch's `DataLoader` and `DistributedSampler`, following the job's rounds: each batch is the committed
step's share for this round's rank and world size.

torch's `DistributedSampler` splits an epoch by rank and world size once, when the epoch's iterator is
made: after a membership change its split no longer adds up, and the step a change dropped is never read
again. Given this module's `DistributedSampler`, this `DataLoader` iterates the job's position in its data
instead (`elastic.policy.sharding`, through an `ElasticSampler` registered with the session as "sampler"):
every batch is checked against the session before it is handed out, and when the round changed since the
batches were laid out (the step that noticed it was dropped; DataLoader workers may have fetched ahead),
the prefetched ones are thrown away and the epoch's remaining steps are laid out afresh for the new round,
from the committed position. The same samples are then read again at the new world size; every committed
sample of an epoch is read once, by one rank. The iteration ends when the job's position leaves the epoch it started in.

Anything else (a plain sampler, `shuffle=True`) is torch's DataLoader unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import torch.utils.data

from elastic.policy.sharding import Position, epoch_steps
from elastic.train.distributed import current_session, join, unique_name
from elastic.train.sampler import ElasticSampler


class DistributedSampler(torch.utils.data.Sampler[int]):
    """torch's `DistributedSampler(dataset, shuffle=True, seed=0)` for `elastic.train.DataLoader`, which asks
    it for each step's share (rank and world size are the round's: leave `num_replicas` and `rank` unset)."""

    def __init__(self, dataset: Sized, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        if num_replicas is not None or rank is not None:
            raise ValueError("elastic.train.DistributedSampler: leave num_replicas and rank unset: they are each "
                             "round's, and change when the membership does")
        self.length = len(dataset)
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last  # accepted for torch's signature: no sample is ever repeated to fill a batch
        self.elastic: ElasticSampler | None = None  # the job's position: made by the DataLoader (batch size)
        self._asked_epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """torch's call at each epoch: a later epoch than the job's position starts there (see
        `ElasticSampler.start_epoch`)."""
        self._asked_epoch = epoch
        if self.elastic is not None:
            self.elastic.start_epoch(epoch)

    def follow(self, batch_size: int) -> ElasticSampler:
        if self.elastic is None:
            self.elastic = ElasticSampler(self.length, batch_size, seed=self.seed, shuffle=self.shuffle)
            self.elastic.start_epoch(self._asked_epoch)
        elif self.elastic.batch_size != batch_size:
            raise ValueError("elastic.train.DistributedSampler: already used by a DataLoader with batch_size="
                             f"{self.elastic.batch_size}; give each DataLoader a sampler of its own")
        return self.elastic

    def __iter__(self) -> Iterator[int]:
        raise TypeError("elastic.train.DistributedSampler lays out each step for the round's ranks: give it to "
                        "elastic.train.DataLoader, not to torch's")


class StepBatches(torch.utils.data.Sampler[list[int]]):
    """The epoch's remaining batches for this rank, laid out when iterated (the session's round, rank, world
    size and committed position at that moment)."""

    def __init__(self, sampler: ElasticSampler) -> None:
        self.sampler = sampler

    def layout(self) -> tuple[int, int, list[Position]]:
        session = join()
        self.sampler.end_unreadable_epoch(session.world_size)
        steps = epoch_steps(self.sampler.length, self.sampler.position, session.world_size, self.sampler.batch_size)
        return session.rank, session.world_size, steps

    def __iter__(self) -> Iterator[list[int]]:
        rank, world_size, steps = self.layout()
        return (self.sampler.indices_at(position, rank, world_size) for position in steps)

    def __len__(self) -> int:
        return len(self.layout()[2])


class DataLoader(torch.utils.data.DataLoader):
    """torch's `DataLoader`; with an `elastic.train.DistributedSampler` it follows the job's rounds (see the
    module docstring). Every other argument is torch's."""

    def __init__(self, dataset: Any, batch_size: int | None = 1, shuffle: bool | None = None,
                 sampler: Any = None, batch_sampler: Any = None, drop_last: bool = False, **kwargs: Any) -> None:
        self._steps: StepBatches | None = None
        if not isinstance(sampler, DistributedSampler):
            super().__init__(dataset, batch_size, shuffle, sampler, batch_sampler, drop_last, **kwargs)
            return
        if shuffle or batch_sampler is not None or not batch_size:
            raise ValueError("elastic.train.DataLoader: with a DistributedSampler, give batch_size and leave "
                             "shuffle and batch_sampler unset (the sampler shuffles; the job lays out the batches)")
        session = current_session()
        elastic = sampler.follow(batch_size)
        session.register(unique_name(session, "sampler", elastic), elastic)
        self._steps = StepBatches(elastic)
        super().__init__(dataset, batch_sampler=self._steps, **kwargs)
        # What torch's attributes would be with this sampler (`loader.sampler.set_epoch(epoch)` in scripts).
        object.__setattr__(self, "sampler", sampler)
        object.__setattr__(self, "batch_size", batch_size)
        object.__setattr__(self, "drop_last", drop_last)

    def __iter__(self) -> Iterator[Any]:
        if self._steps is None:
            return super().__iter__()
        return self._follow(self._steps.sampler)

    def _follow(self, sampler: ElasticSampler) -> Iterator[Any]:
        session = join()
        epoch = sampler.epoch
        while True:
            laid_out = (session.round, session.world_size)
            batches = super().__iter__()
            for batch in batches:
                if (session.round, session.world_size) != laid_out:
                    break  # the membership changed, so the last step was dropped: lay the rest out again
                yield batch
            else:
                if (session.round, session.world_size) == laid_out:
                    return  # read to the end of the layout in one round (a pass that commits nothing ends too)
            del batches  # its workers, if any, stop now
            sampler.end_unreadable_epoch(session.world_size)
            if sampler.epoch != epoch:
                return
