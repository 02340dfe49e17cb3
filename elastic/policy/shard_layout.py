"""Where each rank of a round sits in an HSDP mesh (replicas x shards), so that survivors keep their shards (pure).

With HSDP a rank's model and optimizer state is one shard of `shard_size`; the ranks holding the same shard
index are that shard's replicas. After a membership change the ranks are numbered anew (survivors keep their
relative order, newcomers follow), so a rank's shard index cannot follow from its rank: a survivor that held
shard 1 and is now rank 2 must stay shard 1, or its FSDP module (whose buffers were laid out for shard 1)
would have to be rebuilt. So each rank reports the shard it holds, and `place` keeps every holder on its
shard and fills the shards that lost a replica with the ranks that hold none (replacements, newcomers).
Replica `j` of the layout is the `j`-th rank (in rank order) on each shard: ranks of one replica form a
shard group (FSDP's all-gather and reduce-scatter), ranks of one shard form a replicate group (the
gradients' all-reduce across replicas).

What the layout cannot keep, it refuses with a reason (`LayoutError`): a world that is not a multiple of
the shard size, or more holders of one shard than there are replicas (a survivor would have to change
shards). Every rank reads the same reports, so every rank refuses alike: the session then waits for the
next round (a node joining or leaving whole, or a spare taking the lost rank's place), keeping its state.
"""

from __future__ import annotations

from dataclasses import dataclass


class LayoutError(ValueError):
    """The round's ranks cannot be laid out as whole replicas that keep their shards."""


@dataclass(frozen=True)
class ShardLayout:
    """Each rank's shard index, in rank order (a world of replicas x shard_size)."""

    shard_size: int
    shards: tuple[int, ...]

    @property
    def replicas(self) -> int:
        return len(self.shards) // self.shard_size

    def replica(self, rank: int) -> int:
        """The replica `rank` belongs to: its place among the ranks on its shard."""
        return sum(1 for r in range(rank) if self.shards[r] == self.shards[rank])

    def shard_group(self, rank: int) -> list[int]:
        """The ranks of `rank`'s replica, by shard index (the shard group's rank order is the shard index)."""
        return self.shard_groups()[self.replica(rank)]

    def shard_groups(self) -> list[list[int]]:
        """Every replica's ranks, by shard index (every rank creates every group, in this order)."""
        by_shard = self.replicate_groups()
        return [[ranks[replica] for ranks in by_shard] for replica in range(self.replicas)]

    def replicate_groups(self) -> list[list[int]]:
        """Each shard's ranks, in rank order (the replicate group's rank order is the replica index)."""
        return [[r for r, s in enumerate(self.shards) if s == shard] for shard in range(self.shard_size)]


def place(held: list[int | None], shard_size: int) -> ShardLayout:
    """The layout of a round whose ranks hold `held` (a shard index, or None for a rank that holds no shard).

    Every holder keeps its shard; the other ranks, in rank order, fill the places left replica by replica.
    Raises `LayoutError` with the reason when that cannot make whole replicas."""
    world = len(held)
    if shard_size < 1:
        raise LayoutError(f"the shard size must be at least 1, not {shard_size}")
    if world % shard_size:
        raise LayoutError(f"a world of {world} ranks is not a multiple of the shard size {shard_size}: HSDP in "
                          f"place trains whole replicas of {shard_size} ranks (keep minReplicas, maxReplicas "
                          f"and any scaling step multiples of {shard_size}, or keep a warm spare)")
    replicas = world // shard_size
    outside = [s for s in held if s is not None and not 0 <= s < shard_size]
    if outside:
        raise LayoutError(f"a rank holds shard {outside[0]}, outside a shard size of {shard_size}")
    shards: list[int | None] = list(held)
    for shard in range(shard_size):
        holders = shards.count(shard)
        if holders > replicas:
            raise LayoutError(f"{holders} ranks hold shard {shard} and the world has room for {replicas} "
                              f"replicas: a survivor would have to change shards")
    # The places left, replica by replica (so that a first round puts consecutive ranks, one node's, in one
    # replica: FSDP's traffic inside a node, the replicas' across nodes), taken by the free ranks in order.
    counts = [shards.count(shard) for shard in range(shard_size)]
    needed = [shard for replica in range(replicas) for shard in range(shard_size) if replica >= counts[shard]]
    for rank, shard in zip([r for r, s in enumerate(shards) if s is None], needed, strict=True):
        shards[rank] = shard
    return ShardLayout(shard_size, tuple(s for s in shards if s is not None))
