"""HSDP kept alive in place: FSDP2 shards a model over one replica's ranks, replicas average across rounds.

    with Session(shard_size=2) as session:
        for block in model.blocks:
            fully_shard(block, mesh=session.device_mesh)     # torch's FSDP2, on the session's shard group
        fully_shard(model, mesh=session.device_mesh)
        session.replicate(model)                             # the replicas' gradient average (HSDP)
        optimizer = torch.optim.AdamW(model.parameters())
        session.register("model", model)
        session.register("optimizer", optimizer)
        for step in session.steps(total):
            loss_fn(model(batch)).backward()                 # FSDP2's own all-gathers and reduce-scatters
            if session.should_commit():
                optimizer.step()
                session.commit()
            optimizer.zero_grad()

The shard dimension is fixed (`shard_size` ranks hold one replica of the model, one shard each) and the
replicate dimension is elastic, as in torchft's HSDP: a lost rank's shard comes from a survivor holding the
same shard (its replica peer), over the round's gloo group, from memory; a scale-up by whole replicas gives
each newcomer its shard the same way. Each rank keeps its shard across rounds (`elastic.policy.
shard_layout`), so its FSDP module, built once, stays laid out for it.

Two lasting groups (`RoundGroup`s, re-formed under the same objects at each round, failures as values): the
shard group, which FSDP2's DeviceMesh holds, and the replicate group, whose all-reduce FSDP2 runs after each
reduce-scatter through its `set_all_reduce_hook`. The DeviceMesh is built by hand (torch's `init_device_mesh`
makes groups of its own, which would not outlive the round): one dimension, "shard", this rank at its shard.
"""

from __future__ import annotations

import functools
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from elastic.policy.shard_layout import ShardLayout
from elastic.train.round_group import RoundGroup

SHARD_GROUP = "elastic-shard"
REPLICATE_GROUP = "elastic-replicate"


class ShardedGroups:
    """The shard and replicate groups of an HSDP session, and the device mesh FSDP2 is given."""

    def __init__(self, shard_size: int) -> None:
        self.shard_size = shard_size
        self.device_type = "cpu"  # the training group's device: "cuda" for NCCL (set as groups form)
        self.shard = RoundGroup()
        self.replicate = RoundGroup()
        self.held: int | None = None  # the shard this rank trains (and holds, once its state is in)
        self._mesh: DeviceMesh | None = None

    @property
    def groups(self) -> tuple[RoundGroup, RoundGroup]:
        return self.shard, self.replicate

    def form(self, layout: ShardLayout, rank: int, backend: str, timeout: timedelta, store: dist.Store) -> None:
        """This round's groups under the lasting ones: this rank's replica (shard group, ranked by shard index)
        and its shard's replicas (replicate group, ranked by replica). Made as backends on `store` (the round's),
        not with torch's `new_group`, which orders a group's ranks by their world rank (a survivor keeps its
        shard index whatever its new rank) and is a collective call of the whole world."""
        replica, shard = layout.replica(rank), layout.shards[rank]
        for lasting, kind, ranks, place in ((self.shard, SHARD_GROUP, layout.shard_group(rank), replica),
                                            (self.replicate, REPLICATE_GROUP, layout.replicate_groups()[shard],
                                             shard)):
            index = ranks.index(rank)
            inner = _backend(dist.PrefixStore(f"{kind}/{place}/", store), index, len(ranks), backend, timeout)
            lasting.configure(inner, index, len(ranks), backend)
            lasting.register(kind, ranks)
        self.held = shard
        self.device_type = "cuda" if backend == "nccl" else "cpu"

    def drop(self) -> None:
        """Let the round's groups go (before its world is destroyed: see `RoundGroup.unregister`)."""
        for lasting in self.groups:
            lasting.abort()
            lasting.unregister()
            lasting.configure(None, 0, 1)

    @property
    def device_mesh(self) -> DeviceMesh:
        """FSDP2's mesh: one dimension, "shard", over the lasting shard group, this rank at its shard (which
        survives rounds). Available once the session is in a round."""
        if self._mesh is None:
            if self.held is None:
                raise RuntimeError("Session.device_mesh: the session has no round yet; use it inside `with session:`")
            mesh = DeviceMesh(self.device_type, torch.arange(self.shard_size), mesh_dim_names=("shard",),
                              _init_backend=False, _rank=self.held)
            mesh._dim_group_names = [SHARD_GROUP]
            mesh._pg_registry[SHARD_GROUP] = self.shard
            self._mesh = mesh
        return self._mesh

    def replicate_module(self, module: torch.nn.Module) -> None:
        """Average the reduce-scattered gradients of every FSDP2 module in `module` over the replicas."""
        from torch.distributed.fsdp import FSDPModule

        sharded = [m for m in module.modules() if isinstance(m, FSDPModule)]
        if not sharded:
            raise TypeError("Session.replicate: the module has no fully_shard()ed part; apply fully_shard(module, "
                            "mesh=session.device_mesh) first")
        for part in sharded:
            part.set_all_reduce_hook(functools.partial(_average, self.replicate))


def _backend(store: dist.Store, rank: int, size: int, backend: str, timeout: timedelta) -> dist.Backend:
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def _average(group: RoundGroup, gradient: torch.Tensor) -> None:
    """The reduce-scattered gradient's mean over the replicas (FSDP2 has already divided by the shard group's
    size, or divides after this hook). A failure leaves it as it was: the commit gate drops the step."""
    group.allreduce([gradient]).wait()
    gradient.div_(group.size())
