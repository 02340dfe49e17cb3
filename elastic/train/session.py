"""`Session`: the process group, the step counter and state handover of one worker, across rounds.

Under an in-place agent (`recovery: InPlace`) a membership change does not end the worker: the session
notices the round change through its etcd watch (or a collective failing as a peer dies), abandons the
step, waits for the next sealed round, builds a fresh gloo group on that round's store prefix, and takes
the state from a live peer if it lacks it. Every step's gradient all-reduce carries one more number, the
count of ranks that saw the round end: all ranks read the same sum, so they all commit the step or all
drop it (the commit gate); a step some ranks committed before a fault is kept by the state handover.

Under any other launcher (stock torchrun, restart mode) the same script runs with a plain process group:
a failed collective raises, and the launcher restarts the worker, as without this library.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from elastic.policy.backends import GLOO, GroupPlan, group_plan
from elastic.policy.hang import HangSettings, Verdict, abandon_after, runnable_elapsed, step_deadline, verdict
from elastic.policy.shard_layout import LayoutError, place
from elastic.policy.state_source import transfer_plans
from elastic.rendezvous.fence import RoundFence
from elastic.train import group_sockets
from elastic.train.context import ABANDONED_EXIT, HUNG_EXIT, Heartbeat, Marker, WorkerContext
from elastic.train.cpu_wait import CpuWait
from elastic.train.mesh import ShardedGroups
from elastic.train.progress import ProgressReporter
from elastic.train.registry import StateRegistry
from elastic.train.round_group import COMMUNICATION_ERRORS, RoundGroup, destroy_world, first_line
from elastic.train.rounds import Assignment, RoundFollower, round_over
from elastic.train.transfer import Received, exchange_reports, move_state

WATCHDOG_SECONDS = 0.1
T = TypeVar("T")


@dataclass
class Recovery:
    """How the last (re)configuration went, phase by phase (seconds), for logs and the benchmark."""

    round: int = 0
    wait_round: float = 0.0
    process_group: float = 0.0
    state_transfer: float = 0.0
    received_bytes: int = 0
    source: int = 0


class Session:
    """Owns the default process group of a training loop; see the module docstring.

    The job's state, which a replacement or newcomer receives from a live peer and a checkpoint keeps
    (`session.state_dict()`), is everything registered with the session:

    - `state`: named objects with `state_dict()`/`load_state_dict()` (model, optimizer, LR scheduler,
      gradient scaler, an `ElasticSampler`, ...) or tensors (counters; loaded in place);
    - `state_dict()` / `load_state_dict(d)`: callables for anything else (a dict of tensors and plain values);
    - `rng` (default on): the random number generators' states (torch, CUDA where initialised, Python's
      `random`, NumPy's global one where imported), so a replacement draws what the rank it got the state
      from would have drawn.

    `step`: the committed step this process starts from (a loaded checkpoint's, or set by
    `load_state_dict`); the group adopts the newest one. `shard_size`: HSDP, replicas of that many ranks,
    each rank one FSDP2 shard (`device_mesh`, `replicate`; `elastic.train.mesh`).
    """

    def __init__(
        self,
        state_dict: Callable[[], dict[str, Any]] | None = None,
        load_state_dict: Callable[[dict[str, Any]], None] | None = None,
        *,
        state: Mapping[str, Any] | None = None,
        rng: bool = True,
        step: int = 0,
        timeout: timedelta = timedelta(seconds=60),
        join_timeout: float = 900.0,
        context: WorkerContext | None = None,
        backend: str | None = None,
        shard_size: int | None = None,
    ) -> None:
        self._state = StateRegistry(state_dict, load_state_dict, state, rng)
        self.step = step
        self.timeout = timeout
        self.join_timeout = join_timeout
        self.context = context if context is not None else WorkerContext.from_env()
        self.assignment: Assignment | None = None
        self.recoveries = 0
        self.last_recovery = Recovery()
        self._holds_state = False
        # What a module built on the session's group keeps (DDP's reducer): each round's group behind it.
        self.process_group = RoundGroup()
        if self.context is not None:  # the commit gate's number rides on DDP's last bucket (train/ddp.py)
            self.process_group.gate_flag = lambda: float(self._round_is_over())
        self._follower: RoundFollower | None = None
        self._step_seconds: deque[float] = deque(maxlen=50)
        self._activity_now: tuple[str, float] = ("idle", time.monotonic())
        self._stopped = threading.Event()
        self._progress = ProgressReporter()
        self._total: int | None = None
        self._loss: float | None = None
        self._hang = HangSettings()
        # ELASTIC_LOG_STEPS=1: rank 0 logs each committed step, its round, world size and data position (a
        # run's record: tests replay it, and it says which steps a membership change dropped).
        self._log_steps = os.environ.get("ELASTIC_LOG_STEPS") == "1"
        self._heartbeat: Heartbeat | None = None
        # In place: each round's groups (a gloo one for control, the script's backend for training; see
        # elastic.policy.backends). NCCL's error handling is set before the first NCCL group exists. Under any
        # other launcher the script's own group is the one.
        self._groups = GroupPlan(GLOO)
        if self.context is not None:
            self._groups = group_plan(backend, torch.cuda.device_count(), self.context.local_world_size,
                                      dist.is_nccl_available(), timeout.total_seconds())
            os.environ.update(self._groups.env)
            if self._groups.note:
                print(f"elastic.train: {self._groups.note}", file=sys.stderr, flush=True)
            self._hang = HangSettings(factor=self.context.hang_factor, floor_seconds=self.context.hang_floor_seconds)
            if self.context.marker_dir:
                self._heartbeat = Heartbeat(Heartbeat.path(self.context.marker_dir, self.context.local_rank), True)
        # HSDP (`shard_size`): FSDP2's shard group and the replicas' group, each round's under lasting objects.
        self._sharded = ShardedGroups(shard_size) if shard_size is not None else None
        self._round_store: dist.Store | None = None  # in place: the round's store (stock torchrun: torch's)
        for group in self._lasting_groups:  # a failure in any is every one's: `process_group.error` says it
            group.siblings = [other for other in self._lasting_groups if other is not group]

    @property
    def _activity(self) -> tuple[str, float]:
        """What this worker does now and since when: its watchdog reads it, and so does its agent (through the
        heartbeat), for a worker that is stopped and cannot run its own watchdog."""
        return self._activity_now

    @_activity.setter
    def _activity(self, value: tuple[str, float]) -> None:
        self._activity_now = value
        if self._heartbeat is not None:
            self._heartbeat.write(value[0], value[1], step_deadline(list(self._step_seconds), self._hang))

    # --- where this worker stands ---

    @property
    def in_place(self) -> bool:
        return self.context is not None

    @property
    def rank(self) -> int:
        return self.assignment.rank if self.assignment else dist.get_rank()

    @property
    def world_size(self) -> int:
        return self.assignment.world_size if self.assignment else dist.get_world_size()

    @property
    def round(self) -> int:
        return self.assignment.round if self.assignment else int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    # --- the loop's calls ---

    def register(self, name: str, obj: Any) -> None:
        """Add `obj` to the job's state under `name` (what `state=` does at construction). Registered after the
        session joined, it takes what a peer sent under that name, if anything: a replacement's optimizer that
        the drop-in calls (`elastic.train.init_process_group`) find at its first step gets the survivors' state."""
        self._state.register(name, obj)

    def registered(self, name: str) -> Any | None:
        """What is registered under `name`, if anything."""
        return self._state.registered(name)

    @property
    def joined(self) -> bool:
        """Whether the session has a group (it joins at `with session:`, or at the first use of the drop-in
        calls)."""
        return self.assignment is not None or (self.context is None and self._holds_state)

    @property
    def device_mesh(self) -> Any:
        """HSDP (`shard_size`): the DeviceMesh to give FSDP2's `fully_shard(module, mesh=...)`, over the lasting
        shard group (`elastic.train.mesh`). Inside `with session:`."""
        if self._sharded is None:
            raise RuntimeError("Session.device_mesh: create the session with shard_size=<ranks per replica>")
        return self._sharded.device_mesh

    def replicate(self, module: torch.nn.Module) -> None:
        """HSDP: average the gradients of `module`'s fully_shard()ed parts over the replicas, each round's."""
        if self._sharded is None:
            raise RuntimeError("Session.replicate: create the session with shard_size=<ranks per replica>")
        self._sharded.replicate_module(module)

    @property
    def _lasting_groups(self) -> list[RoundGroup]:
        return [self.process_group, *(self._sharded.groups if self._sharded is not None else ())]

    @property
    def _pending(self) -> bool:
        return any(g.pending for g in self._lasting_groups)

    def __enter__(self) -> Session:
        if self.context is None:
            if not dist.is_initialized():
                dist.init_process_group("gloo", timeout=self.timeout)
            self.process_group.configure(dist.group.WORLD, dist.get_rank(), dist.get_world_size())
            self._adopt_state()
            self._holds_state = True
            self._activity = ("step", time.monotonic())
            return self
        self._follower = RoundFollower(self.context)
        self._mark(None)
        threading.Thread(target=self._watchdog, name="elastic-train-watchdog", daemon=True).start()
        self._join(self.context.after_round)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        if exc[0] is None and self.rank == 0:
            self._progress.report(self.step, self._loss, self.world_size, self._total, final=True)
        self._progress.close()
        self.process_group.configure(None, 0, 1)
        if self._sharded is not None:
            self._sharded.drop()
        if self.context is not None and dist.is_initialized():
            dist.destroy_process_group()
        if self._follower is not None:
            self._follower.close()

    def allreduce_gradients(self, parameters: torch.nn.Module | Iterable[torch.Tensor]) -> bool:
        """Average the gradients over the group. False: the membership changed and this step is dropped on
        every rank (do not apply it; the loop runs step `session.step` again in the new group)."""
        params = parameters.parameters() if isinstance(parameters, torch.nn.Module) else parameters
        grads = [p.grad for p in params if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads] + [torch.zeros(1, dtype=grads[0].dtype)])
        if self.context is None:
            dist.all_reduce(flat)
        elif not self._gate(flat):
            return False
        flat[:-1].div_(self.world_size)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
        return True

    def should_commit(self) -> bool:
        """After the backward pass of a module built on `process_group` (`elastic.train.DistributedDataParallel`):
        True when this step's reductions went through on every rank of the current round, the same answer on
        every rank (one small all-reduce, the commit gate). False: the membership changed, the step is dropped
        on every rank and the session is in the next round (apply nothing; run step `session.step` again).
        Under any other launcher a failed reduction raises, and the launcher restarts the worker."""
        if self.context is None:
            if self.process_group.error is not None:
                raise RuntimeError(f"a collective of step {self.step} failed: {self.process_group.error}")
            return True
        ended = self.process_group.take_gate()  # launched with the backward's last bucket (train/ddp.py)
        return self._gate(torch.zeros(1)) if ended is None else self._settle(self.process_group.error, ended)

    def _gate(self, flat: torch.Tensor) -> bool:
        """All-reduce `flat`, whose last element this rank sets to 1 if it saw the round end: every rank reads
        the same sum, so every rank commits the step or every rank drops it (and recovers into the next round).

        A rank whose reduction already failed (a DDP bucket's, as a value) skips the gate's all-reduce: its group
        is broken, so no rank can complete the gate with it and none commits; and a live peer may still be
        waiting in an earlier bucket's all-reduce with it, which only this rank dropping its group releases
        (4 DDP ranks: the survivors otherwise waited on each other until the watchdog restarted one, exit 86)."""
        failed = self.process_group.error
        if failed is None:
            flat[-1] = float(self._round_is_over())
            _, failed = self._communicate(lambda: dist.all_reduce(flat))
        return self._settle(failed, float(flat[-1].item()))

    def _settle(self, failed: str | None, ended: float) -> bool:
        """The gate's outcome: `failed`, this rank's collective failure, if any; `ended`, how many ranks saw the
        round end. Commit (True), or drop the step and recover into the next round (False)."""
        if failed is not None and not self._round_is_over():
            self._mark(self.assignment.round, broken=True)  # tell the agent: maybe nobody will report it
        if failed is not None or ended > 0:
            self._recover(f"collective failed: {failed}" if failed else "the round ended")
            return False
        return True

    def commit(self, loss: float | None = None) -> None:
        """The step was applied on this rank: count it (and time it, for the hang deadline). Rank 0 reports
        the step (and `loss`, if given) to the job's progress key, at most once a second."""
        now = time.monotonic()
        self._step_seconds.append(now - self._activity[1])
        samplers = self._state.samplers()
        if self._log_steps and self.rank == 0:
            read = " ".join(f"epoch={s.position.epoch} consumed={s.position.consumed}" for s in samplers[:1])
            print(f"elastic.train: committed step={self.step} round={self.round} world_size={self.world_size} {read}",
                  file=sys.stderr, flush=True)
        self.step += 1
        for sampler in samplers:
            sampler.advance(self.world_size)
        self._activity = ("step", now)
        if self.rank == 0:
            self._loss = loss if loss is not None else self._loss
            self._progress.report(self.step, self._loss, self.world_size, self._total)

    def steps(self, total: int) -> Iterator[int]:
        """`for step in session.steps(total)`: the step to run next, until `total` are committed."""
        self._total = total
        while self.step < total:
            yield self.step

    # --- membership changes ---

    def _round_is_over(self) -> bool:
        assert self._follower is not None and self.assignment is not None
        return round_over(self._follower.state(), self.assignment.round)

    def _recover(self, why: str) -> None:
        assert self.assignment is not None
        self._activity = ("idle", time.monotonic())  # not a step any more: the hang deadline does not apply
        print(f"elastic.train: rank {self.rank} leaves round {self.assignment.round} at step {self.step}: {why}",
              file=sys.stderr, flush=True)
        self._drop_group()
        self.recoveries += 1
        self._join(self.assignment.round)

    def _join(self, after: int | None) -> None:
        """Get into the next sealed round that includes this worker, with a group and the job's state."""
        assert self._follower is not None
        started = time.monotonic()
        self._activity = ("idle", started)
        while True:
            found = self._follower.wait_for_assignment(after, self.join_timeout)
            joined_at = time.monotonic()
            self.assignment = found  # the watchdog now checks the round being joined
            try:
                formed, failed = self._communicate(functools.partial(self._form_group, found))
            except LayoutError as err:  # every rank read the same reports: every rank waits for the next round
                self._drop_group()
                print(f"elastic.train: round {found.round} cannot train in place ({err}); waiting for the next",
                      file=sys.stderr, flush=True)
                self._activity = ("idle", time.monotonic())
                after = found.round
                continue
            if failed is None:
                break
            self._drop_group()
            if not round_over(self._follower.state(), found.round):
                # The round holds but its group cannot form: a failure, for the agent to report.
                raise RuntimeError(f"round {found.round}: the process group could not form: {failed}")
            print(f"elastic.train: round {found.round} ended while joining it ({failed}); waiting for the next",
                  file=sys.stderr, flush=True)
            self._activity = ("idle", time.monotonic())
            after = found.round
        assert formed is not None
        grouped_at, received = formed
        self._apply(received)
        self._mark(found.round)
        # This process outlives rounds: its fencing token (elastic.train.checkpoint) follows the round it joined.
        os.environ.update(RoundFence(self.context.endpoints, self.context.job, self._follower.state().run_id or "",
                                     found.round).env())
        done = time.monotonic()
        self.last_recovery = Recovery(
            round=found.round, wait_round=joined_at - started, process_group=grouped_at - joined_at,
            state_transfer=done - grouped_at, received_bytes=received[1].nbytes if received else 0,
            source=received[0] if received else self.rank,
        )
        self._activity = ("step", done)

    def _adopt_state(self) -> None:
        received = self._exchange_state()
        self._apply(received)

    def state_dict(self) -> dict[str, Any]:
        """The job's state as a replacement receives it and a checkpoint keeps it: the committed step, every
        registered object, the callables' dict and the RNG states (`elastic.train.registry`)."""
        return self._state.state_dict(self.step)

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Load what `state_dict()` gave (a peer's or a checkpoint's), the step included."""
        self.step = self._state.load_state_dict(saved)

    def _exchange_state(self) -> tuple[int, Received] | None:
        """Every rank's report, HSDP's groups for this round (each rank on the shard it holds), then each
        shard's handover from its holder; what this rank received, and from whom."""
        held = self._sharded.held if self._sharded is not None and self._holds_state else None
        reports = exchange_reports(self.step, self._holds_state, held or 0, self.world_size)
        placed, mesh = None, None
        if self._sharded is not None:
            layout = place([r.shard if r.holds_state else None for r in reports], self._sharded.shard_size)
            store = self._round_store or dist.distributed_c10d._get_default_store()
            self._sharded.form(layout, self.rank, self._groups.training, self.timeout, store)
            placed, mesh = list(layout.shards), self._sharded.device_mesh
        received = None
        for plan in transfer_plans(reports, placed):
            state = self.state_dict() if self.rank == plan.source else None
            data = move_state(plan, self.rank, self.world_size, state, mesh)
            received = (plan.source, data) if data is not None else received
        return received

    def _apply(self, received: tuple[int, Received] | None) -> None:
        """Load what a peer sent (outside any collective: a bad state dict is the script's own error)."""
        self._holds_state = True
        if received is not None:
            self.load_state_dict(received[1].state)

    def _form_group(self, found: Assignment) -> tuple[float, tuple[int, Received] | None]:
        """A gloo group on the round's store prefix, then the state handover: (when the group formed, what
        this rank received)."""
        assert self._follower is not None
        # Kept: torch holds the store in C++ only, and HSDP's groups are made on it after init_process_group.
        self._round_store = self._follower.group_store(found.round)
        with group_sockets.claimed():  # a forked child closes its copies (a dead rank's sockets close with it)
            dist.init_process_group("gloo", store=self._round_store, rank=found.rank,
                                    world_size=found.world_size, timeout=self.timeout)  # fmt: skip
            training = dist.group.WORLD
            if self._groups.separate_control:  # every rank makes it, on the round's store: a collective call
                training = dist.new_group(backend=self._groups.training, timeout=self.timeout)
        self.process_group.configure(training, found.rank, found.world_size)
        return time.monotonic(), self._exchange_state()

    def _drop_group(self) -> None:
        """Let the round's group go: from the session's lasting groups too (see `destroy_world`)."""
        self.process_group.abort()
        self.process_group.configure(None, 0, 1)
        if self._sharded is not None:
            self._sharded.drop()
        group_sockets.release()
        destroy_world()

    def _communicate(self, action: Callable[[], T]) -> tuple[T | None, str | None]:
        """Run a collective step; a communication failure comes back as its first line, never as the error
        itself: its traceback holds the process group, and only a group nobody references closes its
        connections, which is what makes peers stuck in the same collective fail at once too."""
        try:
            with self._collective():
                return action(), None
        except COMMUNICATION_ERRORS as err:
            return None, first_line(err)

    # --- hang detection ---

    @contextmanager
    def _collective(self) -> Iterator[None]:
        previous = self._activity
        self._activity = ("collective", time.monotonic())
        try:
            yield
        finally:
            self._activity = previous

    def _watchdog(self) -> None:
        """Turns an overdue step into an exit the agent understands (see `elastic.policy.hang`). A step's time
        is its wall time less its threads' waits for a CPU: a starved worker is slow, not stuck (issue 44)."""
        cpu_wait, measured_since = CpuWait(), None
        while not self._stopped.wait(WATCHDOG_SECONDS):
            kind, since = self._activity
            if kind == "idle" or self.assignment is None:
                continue
            if kind == "step" and self._pending:
                kind = "collective"  # a DDP backward waiting on its peers: theirs to report, not this worker's
            if since != measured_since:
                cpu_wait.restart()  # up to one tick late: a wait before it counts as progress, never as a hang
                measured_since = since
            wall = time.monotonic() - since
            steps = list(self._step_seconds)
            deadline = step_deadline(steps, self._hang)
            # The waits cost a read of every thread's schedstat: only a step past its deadline on the wall clock
            # can be past it in its own time, so only such a step reads them.
            overdue = kind == "step" and deadline is not None and wall > deadline
            waited = cpu_wait.waited() if overdue else 0.0
            over = kind == "collective" and self._round_is_over()
            if over and self._pending:
                for group in self._lasting_groups:  # an NCCL collective whose round ended fails now (gloo's alone)
                    group.abort()
            decision = verdict(runnable_elapsed(wall, waited), deadline, kind == "collective", over, self._hang,
                               grace=abandon_after(steps, self._hang))
            if decision is Verdict.CONTINUE:
                continue
            code = ABANDONED_EXIT if decision is Verdict.ABANDON else HUNG_EXIT
            what = ("its round ended under a collective that cannot finish" if code == ABANDONED_EXIT
                    else f"step {self.step} made no progress for {wall - waited:.1f} s of its own time "
                         f"({wall:.1f} s wall, {waited:.1f} s waiting for a CPU)")
            print(f"elastic.train: rank {self.rank} exits ({code}): {what}", file=sys.stderr, flush=True)
            os._exit(code)

    def _mark(self, round_number: int | None, broken: bool = False) -> None:
        """Tell the agent this worker follows rounds itself, the last round it joined, and whether that
        round's group broke under it (see `Marker`)."""
        assert self.context is not None
        if self.context.marker_dir:
            marker = Marker(os.getpid(), round_number, round_number if broken else None)
            marker.write(self.context.marker_dir, self.context.local_rank)

