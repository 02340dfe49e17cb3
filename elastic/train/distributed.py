"""torch.distributed's calls, kept alive in place: what a DDP script changes to survive (its imports).

    from elastic.train import DataLoader, DistributedSampler, epochs               # were torch's
    from elastic.train import DistributedDataParallel as DDP                        # was torch's
    from elastic.train import init_process_group, destroy_process_group            # were torch's

    init_process_group(backend="gloo")
    model = DDP(model)                                     # on the session's lasting group
    loader = DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset))
    for epoch in epochs(epochs_run, max_epochs):           # was: range(epochs_run, max_epochs)
        loader.sampler.set_epoch(epoch)
        for source, targets in loader:                     # this step's batch, at this round's rank and size
            optimizer.zero_grad()
            F.cross_entropy(model(source), targets).backward()
            optimizer.step()                               # applied on every rank of the round, or on none
    destroy_process_group()

`init_process_group` makes the process's `Session` (under stock torchrun: torch's own group beneath it).
The session joins its first round lazily, at the first of: a DDP module built, the loader iterated,
`epochs()` started, an optimizer stepped; by then the script has built what it trains, so a replacement
receives the survivors' state into it. What joins the job's state: each DDP module's `module` ("model"),
each loader's sampler position ("sampler"), the epoch `epochs()` is in ("epoch"), the RNG states, and the
optimizer of the DDP module's parameters ("optimizer", found at its first `step()`: `elastic.train.
optimizer_gate`). Anything else a script keeps (an LR scheduler, a gradient scaler) joins with
`register(name, obj)`.

The loop's `epoch` comes from `epochs()`, not from the script's own count: a replacement started at
epoch 0 (or at its snapshot's) joins the epoch its survivors are in, and every rank ends at the same one.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LRScheduler

from elastic.train.context import WorkerContext
from elastic.train.optimizer_gate import OptimizerGate
from elastic.train.session import Session

_current: tuple[Session, OptimizerGate] | None = None


def init_process_group(backend: str | None = None, *, timeout: timedelta | None = None, **kwargs: Any) -> Session:
    """torch's `init_process_group`, in place: the process's session, which follows the job's rounds under an
    in-place agent. Under any other launcher this is torch's own call (every argument passed on), and a
    failure ends the worker for its launcher to restart, as without this library."""
    global _current
    if _current is not None:
        raise RuntimeError("elastic.train.init_process_group: called twice; call destroy_process_group() first")
    if WorkerContext.from_env() is None:
        dist.init_process_group(backend=backend, timeout=timeout, **kwargs)
    session = Session(timeout=timeout or timedelta(seconds=60), backend=backend)
    gate = OptimizerGate(session, join)
    _current = (session, gate)
    return session


def destroy_process_group() -> None:
    """Leave the job's rounds (rank 0 reports the final step) and destroy the group."""
    global _current
    if _current is None:
        raise RuntimeError("elastic.train.destroy_process_group: no process group (call init_process_group first)")
    session, gate = _current
    _current = None
    gate.remove()
    if session.joined:
        session.__exit__(None, None, None)
    if dist.is_initialized():
        dist.destroy_process_group()


def current_session() -> Session:
    """The session `init_process_group` made (the drop-in calls find it here)."""
    if _current is None:
        raise RuntimeError("elastic.train: no process group: call elastic.train.init_process_group() first (it "
                           "replaces torch.distributed.init_process_group)")
    return _current[0]


def join() -> Session:
    """The current session, in a round: joins the first one on first use (see the module docstring)."""
    session = current_session()
    if not session.joined:
        session.__enter__()
    return session


def register(name: str, obj: Any) -> None:
    """Add an object the drop-in calls do not find themselves (an LR scheduler, a gradient scaler) to the
    job's state: a replacement receives it from a survivor, and a checkpoint of `state_dict()` keeps it. An
    LR scheduler's `step()` then does nothing after a dropped step (`OptimizerGate.guard`)."""
    current_session().register(name, obj)
    if isinstance(obj, LRScheduler):
        assert _current is not None
        _current[1].guard(obj)


def unique_name(session: Session, base: str, obj: Any) -> str:
    """`base`, or `base.1`, `base.2`, ... for the next object of a kind: the same names on every rank, since
    every rank builds its objects in the same order."""
    names = itertools.chain([base], (f"{base}.{n}" for n in itertools.count(1)))
    return next(name for name in names if session.registered(name) in (None, obj))


def epochs(start: int, stop: int) -> Iterator[int]:
    """`range(start, stop)` over the job's epochs: from the epoch the job is in when that is later than
    `start` (a replacement's loop, or a survivor's after a restart, resumes the job's), up to `stop`."""
    session = current_session()
    current = torch.zeros((), dtype=torch.int64)
    session.register(unique_name(session, "epoch", current), current)
    join()
    while (epoch := max(start, int(current))) < stop:
        current.fill_(epoch)
        yield epoch
        current.fill_(epoch + 1)
