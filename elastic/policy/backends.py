"""Which process groups an in-place round builds, and how NCCL is set up to be aborted (pure).

A session's control traffic (the commit gate's one number, the state handover's header, the reports of who
holds the state) is small and on the CPU: it always goes over a gloo group, the round's default group. The
training traffic (DDP's buckets) goes over the backend the script asked for. With NCCL that is a second
group beside the gloo one, on the same round's store.

NCCL's own reaction to a peer that died is to hang a collective until its watchdog's timeout and then, with
torch's agent default `TORCH_NCCL_ASYNC_ERROR_HANDLING=1`, to tear the whole process down: fine for a
restart, fatal in place, where the process must survive. So in place the variable is 0 (torch's
`_abort_process_group` is documented for that setting), the session aborts the round's NCCL communicator
itself when the round ends under a pending collective (the collective then fails, as a value, and the
commit gate drops the step), and the watchdog's timeout is the session's, so that a hang nobody notices
still ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GLOO = "gloo"
NCCL = "nccl"


@dataclass(frozen=True)
class GroupPlan:
    """What a round builds: `training` carries the model's collectives; the control group is always gloo
    (a separate one when `training` is not)."""

    training: str
    env: dict[str, str] = field(default_factory=dict)  # set in the worker before its first NCCL group
    timeout_seconds: float = 60.0  # NCCL's watchdog timeout (the session's collective timeout)
    note: str | None = None  # why the script's request was not taken as it was

    @property
    def separate_control(self) -> bool:
        return self.training != GLOO


def requested_training(backend: str | None) -> str | None:
    """The training backend a `backend` argument of torch's `init_process_group` asks for: "gloo", "nccl",
    or None (torch's default for the device), from a plain name or torch's "cpu:gloo,cuda:nccl" form (NCCL
    for the GPUs' tensors wins: that is where the model trains)."""
    if not backend:
        return None
    names = {part.strip().lower().rpartition(":")[2] for part in backend.split(",")}
    if not names <= {GLOO, NCCL}:
        raise ValueError(f"init_process_group(backend={backend!r}): in place a round's group is gloo or NCCL; "
                         "give backend='nccl' (GPUs), 'gloo' (CPU) or leave it unset")
    return NCCL if NCCL in names else GLOO


def group_plan(backend: str | None, gpus: int, local_ranks: int, nccl: bool, timeout_seconds: float) -> GroupPlan:
    """The groups a round builds for the script's `backend` on this machine: `gpus` usable here, `local_ranks`
    workers sharing them (NCCL refuses two ranks on one GPU), `nccl`: torch was built with NCCL."""
    wanted = requested_training(backend)
    usable = gpus >= local_ranks >= 1 and nccl
    if wanted is None:
        wanted = NCCL if usable else GLOO
    if wanted == GLOO:
        return GroupPlan(GLOO, timeout_seconds=timeout_seconds)
    if not usable:
        missing = ("no usable GPU" if gpus == 0 else "a torch built without NCCL" if not nccl
                   else f"{gpus} GPU(s) for {local_ranks} local ranks (NCCL needs one each)")
        return GroupPlan(GLOO, timeout_seconds=timeout_seconds,
                         note=f"backend {backend!r}: {missing} here, so the round's group is gloo")
    return GroupPlan(NCCL, env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, timeout_seconds=timeout_seconds)
