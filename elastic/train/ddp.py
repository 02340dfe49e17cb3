"""torch's DistributedDataParallel, kept alive in place across membership changes.

    model = elastic.train.DistributedDataParallel(model)      # after elastic.train.init_process_group()

(the drop-in calls, `elastic.train.distributed`: the module joins the job's state as "model" and its
optimizer's `step()` is gated), or in a `Session` loop:

    model = elastic.train.DistributedDataParallel(model, process_group=session.process_group)
    for step in session.steps(total):
        loss_fn(model(batch)).backward()          # DDP's own bucketed, overlapped all-reduce
        if session.should_commit():               # False: the membership changed; every rank drops the step
            optimizer.step()
            session.commit()
        optimizer.zero_grad()

It is torch's class (an `isinstance` of it, every option of it), with three differences that membership
changes need. At each new round the session resets it (`RoundGroup.configure`: torch's
`_update_process_group`), so that a survivor's buckets and a replacement's are laid out alike. Its gradient
average divides by the round's world size at each bucket (torch's reducer divides by the size the group had
when the module was built, which would be wrong after a change): a communication hook does the bucket's
all-reduce on the session's `RoundGroup`. It does not synchronise at construction (`init_sync=False`):
the session has already given every rank the same state, and a replacement building its module alone must
not wait for a broadcast the survivors, whose modules exist, never make. And its buckets keep the layout
they were built with (`find_unused_parameters=True`, under which torch never re-lays them): torch otherwise
re-lays a module's buckets in gradient order after its first backward, so a survivor's and a replacement's
first step in a new round would pair different parameters in one all-reduce (seen: ranks' models apart by
1e-6 after one such step). The cost is torch's walk of the autograd graph per forward and a small all-reduce
of which parameters were used.
"""

# No `from __future__ import annotations` here: torch checks the hook's annotations as objects
# (`bucket: dist.GradBucket`), and postponed ones are strings.
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as TorchDistributedDataParallel

from elastic.train.distributed import current_session, join, unique_name
from elastic.train.round_group import RoundGroup


class DistributedDataParallel(TorchDistributedDataParallel):
    def __init__(self, module: torch.nn.Module, *args: Any, process_group: RoundGroup | None = None,
                 **kwargs: Any) -> None:
        if process_group is None:  # the drop-in calls: the session of `elastic.train.init_process_group`
            session = current_session()
            session.register(unique_name(session, "model", module), module)
            process_group = join().process_group
        if not isinstance(process_group, RoundGroup):
            raise TypeError("elastic.train.DistributedDataParallel: pass process_group=session.process_group (the "
                            f"group that outlives rounds) or leave it unset, not a {type(process_group).__name__}")
        if kwargs.get("static_graph") or kwargs.get("find_unused_parameters") is False:
            raise ValueError("elastic.train.DistributedDataParallel: static_graph=True and "
                             "find_unused_parameters=False let torch re-lay its buckets after the first step, "
                             "and a module built in a later round (a replacement's) would then lay them out "
                             "otherwise than a survivor's: leave both unset")
        kwargs.setdefault("init_sync", False)
        kwargs.setdefault("find_unused_parameters", True)
        super().__init__(module, *args, process_group=process_group, **kwargs)
        self.register_comm_hook(process_group, average_over_round)
        process_group.attach(self)


def average_over_round(group: RoundGroup, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The bucket's mean over the ranks of the current round (a failed all-reduce leaves it as it was: the
    step is dropped at the commit gate). With the last bucket, the gate's own all-reduce starts too, so that
    `Session.should_commit` waits for no further round trip (measured: a step of 13 ms took 1 ms more with
    the gate's all-reduce after the backward)."""
    buffer = bucket.buffer().div_(group.size())
    future = group.allreduce([buffer]).get_future().then(lambda done: done.value()[0])
    if bucket.is_last():
        group.launch_gate()
    return future
