"""The commit gate at a script's own `optimizer.step()`: applied on every rank of the round, or on none.

The drop-in calls (`elastic.train.distributed`) let a script keep `loss.backward(); optimizer.step()`. Its
optimizer is found by torch's global optimizer hooks: one whose parameters are those of a DDP module built
on the session's group. Before its step, the gate (`Session.should_commit`) asks every rank whether the
step's reductions went through; when the membership changed, the session is already in the next round and
the step is dropped on every rank by clearing the gradients (torch's optimizers skip a parameter without a
gradient: no update, no momentum, no weight decay); the loader then hands the same samples out again at the
new world size. After an applied step the session counts it (`Session.commit`: the step, the sampler's
position). At the optimizer's first step the gate registers it with the session ("optimizer"), which is when
a replacement loads the state its survivors sent for it.

An LR scheduler registered through `elastic.train.register` steps only after an applied step (`guard`): its
schedule counts committed steps, which is what a replacement that receives it counts too.

One gated optimizer per process: a second one would commit every step twice (scripts with several
optimizers use the `Session` loop, where the script commits once per step).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from elastic.train.session import Session


class OptimizerGate:
    """Installs the two global hooks for one session (`remove` takes them away)."""

    def __init__(self, session: Session, join: Callable[[], Session]) -> None:
        self.session = session
        self._join = join
        self._gated: weakref.WeakKeyDictionary[torch.optim.Optimizer, bool] = weakref.WeakKeyDictionary()
        self._dropped: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()  # their last step was dropped
        self._handles = [register_optimizer_step_pre_hook(self._before_step),
                         register_optimizer_step_post_hook(self._after_step)]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()

    def _is_gated(self, optimizer: torch.optim.Optimizer) -> bool:
        if optimizer not in self._gated:
            trained = {id(p) for p in self.session.process_group.parameters()}
            gated = any(id(p) in trained for group in optimizer.param_groups for p in group["params"])
            if gated and any(self._gated.values()):
                raise RuntimeError("elastic.train: a second optimizer over a DDP module's parameters; the drop-in "
                                   "calls gate one optimizer per process (with several, use the Session loop: "
                                   "`if session.should_commit(): ...; session.commit()`)")
            self._gated[optimizer] = gated
            if gated:
                self.session.register("optimizer", optimizer)
        return self._gated[optimizer]

    def guard(self, scheduler: LRScheduler) -> None:
        """`scheduler.step()` does nothing after a dropped step of its optimizer."""
        step = scheduler.step

        def step_if_applied(*args: Any, **kwargs: Any) -> None:
            if scheduler.optimizer not in self._dropped:
                step(*args, **kwargs)

        scheduler.step = step_if_applied  # type: ignore[method-assign]

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._dropped.discard(optimizer)
        if not self._is_gated(optimizer):
            return
        # A step whose backward ran before the session had a group reduced nothing: dropped like any other.
        joined_before = self.session.joined
        self._join()
        if joined_before and self.session.should_commit():
            return
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                parameter.grad = None
        self._dropped.add(optimizer)

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if optimizer not in self._dropped and self._gated.get(optimizer):
            self.session.commit()
