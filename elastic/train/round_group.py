"""A process group that outlives its rounds: the object a DDP module keeps, whose backend is each round's.

torch's modules bind their process group once (DDP's reducer at construction). In place, the group changes
at every membership change, so the module gets this one: a `torch.distributed.ProcessGroup` whose collectives
go to the current round's group, swapped under the same Python object by the session (`configure`) when it
joins a round. Errors come back as values (borrowed from torchft's `ProcessGroup`): a collective that fails as
a peer dies completes with its input unchanged and records the error, so a DDP backward finishes on every
survivor instead of raising deep in the reducer; the session's commit gate (`Session.should_commit`) then
drops the step on every rank and re-forms the group. After a failure, every collective of the round is
skipped the same way: the round is over for this rank.
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

BACKEND_NAME = "elastic-round"
# What a collective raises as a peer dies (or its round's store goes away).
COMMUNICATION_ERRORS = (RuntimeError, dist.DistError)


class DoneWork(dist.Work):
    """A collective's handle whose future holds a value already, or the value of a future that swallowed its
    error (what DDP's reducer waits on)."""

    def __init__(self, future: torch.futures.Future[Any]) -> None:
        super().__init__()
        self._future = future

    def wait(self, timeout: Any = None) -> bool:
        self._future.wait()
        return True

    def get_future(self) -> torch.futures.Future[Any]:
        return self._future


class RoundGroup(dist.ProcessGroup):
    """The current round's group behind one lasting object (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(0, 1)
        self._inner: dist.ProcessGroup | None = None
        self._inner_backend: str | None = None
        self._rank, self._size = 0, 1
        self.error: str | None = None  # the first collective failure of this round, as a line
        # The rank's other lasting groups (HSDP's shard and replicate groups beside this one): a failure in any
        # ends the round for all of them, so that this rank skips the rest of its step's collectives and
        # reaches the gate, where dropping its groups releases the peers still waiting on it.
        self.siblings: list[RoundGroup] = []
        self._modules: weakref.WeakSet[Any] = weakref.WeakSet()  # DDP modules built on this group
        self._pending = 0  # collectives started and not yet completed (the hang watchdog reads it)
        self._pending_lock = threading.Lock()
        self._gate: tuple[torch.Tensor, dist.Work] | None = None  # the commit gate's all-reduce, in flight
        self.gate_flag: Callable[[], float] | None = None  # in place: 1.0 when this rank saw the round end
        self._name: str | None = None  # the name c10d knows it by, while registered (see `register`)

    @property
    def pending(self) -> bool:
        """Whether a collective is in flight: a DDP backward waiting on one is waiting on its peers, which the
        hang watchdog must judge as a collective, not as this worker's own step hanging."""
        return self._pending > 0

    def _count(self, change: int) -> None:
        with self._pending_lock:
            self._pending += change

    def attach(self, module: Any) -> None:
        """A DDP module built on this group: reset at every new round (see `configure`)."""
        self._modules.add(module)

    def launch_gate(self) -> None:
        """Start the commit gate's all-reduce of this rank's `gate_flag()` now, beside the backward's last bucket
        (DDP's hook calls this), so that it overlaps that bucket's all-reduce instead of adding a round trip
        after it; `take_gate` gives the sum to the gate. Nothing without a round, or outside an in-place one."""
        if self._inner is None or self.gate_flag is None:
            return
        tensor = torch.tensor([self.gate_flag()])
        self._gate = (tensor, self.allreduce([tensor]))

    def take_gate(self) -> float | None:
        """The gate's sum launched with this step's last bucket (None: none was, e.g. under `no_sync()`); a
        failed all-reduce leaves this rank's own flag, and the failure is in `error`."""
        gate, self._gate = self._gate, None
        if gate is None:
            return None
        tensor, work = gate
        work.wait()
        return float(tensor.item())

    def parameters(self) -> list[torch.nn.Parameter]:
        """The parameters of the DDP modules built on this group (the optimizer gate finds their optimizer)."""
        return [p for module in list(self._modules) for p in module.parameters()]

    def configure(self, inner: dist.ProcessGroup | dist.Backend | None, rank: int, size: int,
                  backend: str | None = None) -> None:
        """Use `inner` (the round's group, or a backend made directly: then `backend` names it) from now on;
        None lets the old group go (its sockets close only once nothing references it, which is what makes
        peers stuck in it fail at once).

        Every DDP module built on this group is reset for the new round (torch's `_update_process_group`):
        its reducer forgets a backward the old round cut short, and it rebuilds its buckets after its next
        backward, as a module built in this round (a replacement's) does, so that their bucket layouts and
        the collective that settles them meet."""
        self._inner, self._rank, self._size, self.error, self._gate = inner, rank, size, None, None
        # Read here, on the session's thread: the watchdog's thread may abort while this one drops the group.
        self._inner_backend = backend or (dist.get_backend(inner) if inner is not None else None)
        if inner is not None:
            for module in list(self._modules):
                module._update_process_group(self)

    def abort(self) -> None:
        """Abort the round's NCCL communicator, so that its pending collectives fail now (as values) instead
        of at NCCL's watchdog timeout. A gloo group needs none: its collectives fail as soon as a peer's
        sockets close, and dropping the group closes this rank's."""
        inner = self._inner
        if inner is not None and self._inner_backend == "nccl":
            self._inner_backend = None  # once: the watchdog asks at every tick while the round stays over
            dist.distributed_c10d._abort_process_group(inner)

    @property
    def group_name(self) -> str:  # type: ignore[override]
        if self._name is None:
            raise RuntimeError("this RoundGroup is not registered (it is, while the session is in a round)")
        return self._name

    def register(self, name: str, ranks: list[int]) -> None:
        """Make this group known to c10d by `name`, as torch's own groups are: a DeviceMesh (FSDP2's) resolves
        its groups by name, and torch's collectives ask c10d's world for a group's backend and ranks. `ranks`:
        the round's ranks of its members, in group rank order. Done at each round (destroying a round's world
        forgets every group c10d knows), undone by `unregister` before that."""
        world = dist.distributed_c10d._world
        world.pg_map[self] = (BACKEND_NAME, None)
        world.pg_names[self] = name
        world.pg_group_ranks[self] = {rank: index for index, rank in enumerate(ranks)}
        torch._C._distributed_c10d._register_process_group(name, self)
        self._name = name

    def unregister(self) -> None:
        """Forget what `register` made known (nothing if it was not), before the round's world is destroyed:
        torch shuts down every group it knows, and this one's round ends under it, not with it."""
        if self._name is None:
            return
        world = dist.distributed_c10d._world
        for known in (world.pg_map, world.pg_names, world.pg_group_ranks):
            known.pop(self, None)
        torch._C._distributed_c10d._unregister_process_group(self._name)
        self._name = None

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        return self._run(lambda inner: inner.allreduce(tensors, *_given(opts)), tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        return self._run(lambda inner: inner.broadcast(tensors, *_given(opts)), tensors)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        return self._run(lambda inner: inner.allgather(outputs, inputs, *_given(opts)), outputs)

    # FSDP2's collectives on its shard group (torch 2.13 calls these names; older torch the underscored ones)
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        return self._run(lambda inner: inner._allgather_base(output, input, *_given(opts)), output)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        return self._run(lambda inner: inner._reduce_scatter_base(output, input, *_given(opts)), output)

    _allgather_base = all_gather_single
    _reduce_scatter_base = reduce_scatter_single

    # What torch's functional collectives (DTensor's `full_tensor()`, redistribution) call through c10d
    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> dist.Work:
        def each(inner: Any) -> dist.Work:  # a backend made directly has no coalesced call: one by one
            for output, input in zip(outputs, inputs, strict=True):
                inner._allgather_base(output, input).wait()
            return _done(outputs)

        return self._run(each, outputs)

    def barrier(self, opts: Any = None) -> dist.Work:
        return self._run(lambda inner: inner.barrier(*_given(opts)), [])

    def _run(self, collective: Callable[[dist.ProcessGroup], dist.Work], result: Any) -> dist.Work:
        if self._inner is None or self.error is not None:
            return _done(result)
        self._count(+1)
        try:
            work = collective(self._inner)
        except COMMUNICATION_ERRORS as err:
            self._count(-1)
            self._failed(err)
            return _done(result)

        def value_or_input(future: torch.futures.Future[Any]) -> Any:
            self._count(-1)
            try:
                return future.value()
            except COMMUNICATION_ERRORS as err:
                self._failed(err)
                return result

        try:
            future = work.get_future()
        except RuntimeError:  # gloo's reduce-scatter has no future: it completes here, its failure as a value
            future = torch.futures.Future()
            try:
                work.wait()
                future.set_result(result)
            except COMMUNICATION_ERRORS as err:
                future.set_exception(err)
        return DoneWork(future.then(value_or_input))

    def _failed(self, err: BaseException) -> None:
        line = first_line(err)
        for group in (self, *self.siblings):
            if group.error is None:
                group.error = line


def _given(opts: Any) -> tuple[Any, ...]:
    return () if opts is None else (opts,)


def _done(value: Any) -> DoneWork:
    future: torch.futures.Future[Any] = torch.futures.Future()
    future.set_result(value)
    return DoneWork(future)


def destroy_world() -> None:
    """Destroy the default group and free it now: its sockets close, so its peers' pending receives fail
    at once (gloo on torch 2.13: neither abort() nor shutdown() does that, nor a group still referenced).

    Survivors leave a broken group in a cascade (a rank stuck in a ring receive fails only once its neighbour
    dropped the group), so this is on every recovery's path: a full collection costs 0.1 s in a process with
    torch loaded, and is only run when a reference cycle (a traceback's frames) still holds the group.
    """
    if not dist.is_initialized():
        # A group that failed half-way through init_process_group took a group number without registering
        # a world, and only destroying the world resets the counter: unreset, this process would name its
        # next group "1/" in the store while a fresh peer names it "0/", and neither would ever find the other.
        dist.distributed_c10d._world.group_count = 0
        gc.collect()
        return
    group = weakref.ref(dist.group.WORLD)
    dist.destroy_process_group()
    if group() is not None:
        gc.collect()


def first_line(err: BaseException) -> str:
    """A communication failure as one line: never the error itself, whose traceback holds the process group."""
    text = str(err).strip().splitlines()
    return text[0][:200] if text else type(err).__name__
