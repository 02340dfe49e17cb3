"""A small, real, elastic-friendly DDP training job for stock `torchrun` (any rendezvous backend).

Why it exists: the rendezvous, budget and controller code need a workload that behaves like real
training (collectives every step, a checkpoint to resume from, a world size that may change between
rounds) but that needs no GPU, no download and only seconds of CPU. Tests and benchmarks parse its
output, so the printed lines are a stable format:

    started rank=<r> world_size=<w> resumed_from=<step>                                  (every rank)
    step=<int> loss=<float .4f> world_size=<int> restart=<int> time=<unix time .3f>       (rank 0, per step)
    done step=<int>                                                                       (rank 0, at the end)

Run it with, e.g.:

    torchrun --standalone --nproc-per-node=2 examples/train_ddp.py --steps 200
    torchrun --nnodes=1:4 --rdzv-backend=etcd-v3 --rdzv-endpoint=... examples/train_ddp.py

Elastic behaviour:
- Every `--checkpoint-every` steps rank 0 writes `DIR/checkpoint.pt` atomically (temp file, fsync, then
  `elastic.train.checkpoint.publish`, an `os.replace` fenced by the worker's round: a worker whose round has
  ended, such as one whose agent died, cannot replace what the next round resumes from), then all ranks pass
  a barrier, so no rank runs ahead of a checkpoint that is not yet on disk: a crash after step s always
  resumes from the last multiple of K at or below s.
- At start rank 0 loads that checkpoint (model, optimizer, step) and broadcasts it to every rank, so
  ranks on other hosts need no shared filesystem; only rank 0 of the new round must see `DIR`.
  Training continues from the saved step, so step numbers keep growing across re-rendezvous rounds,
  whatever the world size of the new round.
- The data is synthetic and deterministic: each rank draws its batch from a generator seeded by
  (seed, step, rank), so no sampler state has to be checkpointed and a new world size just works.
- `--crash-at-step` makes one worker exit with a chosen code exactly once (guarded by a marker file),
  to demonstrate and test restarts and the failure policy.
- If `ELASTIC_PROGRESS_KEY` and `ELASTIC_ETCD_ENDPOINTS` are set, rank 0 also writes its progress as JSON
  to that etcd key at every checkpoint (best effort: a failing report never stops training).

Caveat with torch's own c10d/standalone rendezvous: by default torchrun hands every restart the same
worker TCPStore with no per-attempt prefix, so a restarted gloo group can read the dead group's addresses
and fail ("connectFullMesh ... Connection refused") or hang (pytorch#135712). Set
`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` for restarts with those backends; the script cannot fix this
itself (the restart count is per agent, so it is no safe prefix across nodes).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from elastic.train.checkpoint import publish

CHECKPOINT_NAME = "checkpoint.pt"

# A dead peer must surface as an error that torchrun turns into a failed round, not as a hang:
# torch's default collective timeout is 30 minutes.
PROCESS_GROUP_TIMEOUT = timedelta(seconds=60)

# Problem size: a fixed random "teacher" labels points in 16 dimensions into 4 classes; the student is a
# 16-64-4 MLP (1,348 parameters), big enough for the loss to fall visibly, small enough for any CPU.
INPUT_DIM = 16
HIDDEN_DIM = 64
NUM_CLASSES = 4
BATCH_SIZE = 32


@dataclass(frozen=True)
class Env:
    """What torchrun tells a worker through its environment."""

    rank: int
    world_size: int
    restart: int


def emit(line: str, stream: TextIO | None = None) -> None:
    """Write one whole line in one call and flush.

    torchrun starts workers with `python -u`, where `print` issues the text and the newline as two
    writes: lines of two ranks sharing a pipe then interleave ("started rank=0 ...started rank=1 ...").
    One write of a short line to a pipe is atomic, so parsers always see whole lines.
    """
    out = stream if stream is not None else sys.stdout
    out.write(line + "\n")
    out.flush()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="total optimizer steps of the job (default 200)")
    parser.add_argument(
        "--step-seconds",
        type=float,
        default=0.05,
        help="sleep per step, so that a run lasts long enough for elastic tests (default 0.05)",
    )
    parser.add_argument(
        "--checkpoint-dir",
        default=os.environ.get("ELASTIC_CHECKPOINT_DIR", "./checkpoints"),
        help="where checkpoint.pt lives (default: $ELASTIC_CHECKPOINT_DIR or ./checkpoints)",
    )
    parser.add_argument(
        "--checkpoint-every", type=int, default=10, help="checkpoint (and report progress) every K steps (default 10)"
    )
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the problem, the model and the data (default 0)")
    parser.add_argument(
        "--crash-at-step",
        type=int,
        default=None,
        help="at this step the worker with RANK 1 (RANK 0 if alone) exits with --crash-exit-code",
    )
    parser.add_argument("--crash-exit-code", type=int, default=1, help="exit code of the crash (default 1)")
    parser.add_argument(
        "--linger-seconds",
        type=float,
        default=0.0,
        help="ranks other than 0 stay up this long after training (shows successPolicy Rank0)",
    )
    parser.add_argument(
        "--crash-once-marker",
        default=None,
        help="file created at the crash (relative: in the checkpoint dir); if it exists already there is no "
        "crash (without it: crash every time)",
    )
    args = parser.parse_args(argv)
    if args.steps < 0:
        parser.error("--steps must be >= 0")
    if args.checkpoint_every < 1:
        parser.error("--checkpoint-every must be >= 1")
    if args.step_seconds < 0:
        parser.error("--step-seconds must be >= 0")
    return args


def read_env() -> Env:
    """Read torchrun's variables; without torchrun, behave as a one-process job (handy for debugging)."""
    if "WORLD_SIZE" not in os.environ:
        os.environ.setdefault("RANK", "0")
        os.environ["WORLD_SIZE"] = "1"
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    return Env(
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_model(seed: int) -> nn.Module:
    """The student; seeded so that a fresh start is reproducible (DDP also broadcasts rank 0's weights)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(INPUT_DIM, HIDDEN_DIM), nn.Tanh(), nn.Linear(HIDDEN_DIM, NUM_CLASSES))


def teacher_weights(seed: int) -> torch.Tensor:
    """The fixed labelling rule, derived from the seed alone so every rank and every round agree on it."""
    gen = torch.Generator().manual_seed(seed + 1_000_003)
    return torch.randn(INPUT_DIM, NUM_CLASSES, generator=gen)


def batch(seed: int, step: int, rank: int, teacher: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch for this step: a pure function of (seed, step, rank), so nothing to checkpoint."""
    gen = torch.Generator().manual_seed((seed * 1_000_003 + step) * 1_009 + rank)
    x = torch.randn(BATCH_SIZE, INPUT_DIM, generator=gen)
    y = (x @ teacher).argmax(dim=1)
    return x, y


def load_checkpoint(path: Path, env: Env) -> dict[str, Any] | None:
    """Rank 0 reads the checkpoint and broadcasts it, so other hosts need no copy of the file."""
    obj: list[dict[str, Any] | None] = [None]
    if env.rank == 0 and path.exists():
        obj[0] = torch.load(path, map_location="cpu", weights_only=True)
    if env.world_size > 1:
        dist.broadcast_object_list(obj, src=0)
    return obj[0]


def save_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, step: int, env: Env) -> None:
    """Rank 0 writes atomically: a reader (or a crash mid-write) sees the old file or the new one, never half."""
    if env.rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "step": step,
            "world_size": env.world_size,
        }
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        publish(tmp, path)  # an os.replace that a worker of an ended round cannot do
    # Nobody runs ahead of a checkpoint that is not on disk yet: a crash resumes from the newest one.
    dist.barrier()


def maybe_crash(args: argparse.Namespace, step: int, env: Env) -> None:
    """Simulate a worker failure once: the marker file makes the restarted round run through."""
    if args.crash_at_step is None or step != args.crash_at_step:
        return
    if env.rank != (1 if env.world_size > 1 else 0):
        return
    if args.crash_once_marker:
        marker = Path(args.checkpoint_dir) / args.crash_once_marker  # a relative marker lives with the run
        marker.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(marker, "x") as f:  # exclusive create: two racing processes cannot both crash
                f.write(f"crashed at step {step} rank {env.rank} pid {os.getpid()}\n")
        except FileExistsError:
            return
    emit(f"crashing rank={env.rank} step={step} exit_code={args.crash_exit_code}", sys.stderr)
    os._exit(args.crash_exit_code)  # no cleanup, like a real crash


class ProgressReporter:
    """Best-effort progress in etcd for controllers and dashboards; it must never stop the training."""

    def __init__(self, endpoints: str | None, key: str | None) -> None:
        self.endpoints = endpoints
        self.key = key
        self._store: Any = None
        self._warned = False

    @property
    def enabled(self) -> bool:
        return bool(self.endpoints and self.key)

    def report(self, step: int, loss: float, world_size: int) -> None:
        if not self.enabled:
            return
        try:
            if self._store is None:
                from elastic.store import EtcdAuth, Store  # optional: the script also runs without this project

                # Short retries: a dead etcd may delay a step by a second or two, not by the default 10 s.
                # TLS/auth settings come from ELASTIC_ETCD_* (the controller's agent passes them down).
                self._store = Store(self.endpoints, timeout=1.0, retry_seconds=1.0, auth=EtcdAuth.from_env())
            self._store.put_json(self.key, {"step": step, "loss": loss, "world_size": world_size, "at": time.time()})
        except Exception as err:  # report failures of any kind, once, and carry on training
            if not self._warned:
                self._warned = True
                emit(f"progress report to {self.key!r} failed (later failures are not logged): {err!r}", sys.stderr)

    def close(self) -> None:
        if self._store is not None:
            with contextlib.suppress(Exception):
                self._store.close()
            self._store = None


def train(args: argparse.Namespace, env: Env) -> int:
    """The training loop; returns the step reached."""
    ckpt_path = Path(args.checkpoint_dir) / CHECKPOINT_NAME
    model = build_model(args.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    ckpt = load_checkpoint(ckpt_path, env)
    start = 0
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start = int(ckpt["step"])
    emit(f"started rank={env.rank} world_size={env.world_size} resumed_from={start}")

    ddp = DistributedDataParallel(model)
    teacher = teacher_weights(args.seed)
    loss_fn = nn.CrossEntropyLoss()
    reporter = ProgressReporter(os.environ.get("ELASTIC_ETCD_ENDPOINTS"), os.environ.get("ELASTIC_PROGRESS_KEY"))

    step = start
    saved = start
    mean = float("nan")
    try:
        for step in range(start + 1, args.steps + 1):
            maybe_crash(args, step, env)
            x, y = batch(args.seed, step, env.rank, teacher)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x), y)
            loss.backward()  # DDP averages the gradients over all ranks here
            optimizer.step()

            # The job's loss, not rank 0's alone: one more tiny all-reduce per step.
            mean_loss = loss.detach().clone()
            dist.all_reduce(mean_loss)
            mean = mean_loss.item() / env.world_size
            if env.rank == 0:
                emit(
                    f"step={step} loss={mean:.4f} world_size={env.world_size} "
                    f"restart={env.restart} time={time.time():.3f}"
                )
            if step % args.checkpoint_every == 0:
                save_checkpoint(ckpt_path, model, optimizer, step, env)
                saved = step
                if env.rank == 0:
                    reporter.report(step, mean, env.world_size)
            if args.step_seconds:
                time.sleep(args.step_seconds)
        if saved != step:
            save_checkpoint(ckpt_path, model, optimizer, step, env)
            if env.rank == 0:
                reporter.report(step, mean, env.world_size)
    finally:
        reporter.close()
    return step


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    env = read_env()
    dist.init_process_group("gloo", timeout=PROCESS_GROUP_TIMEOUT)
    try:
        step = train(args, env)
        dist.barrier()
        if env.rank == 0:
            emit(f"done step={step}")
    finally:
        dist.destroy_process_group()
    if env.rank != 0 and args.linger_seconds > 0:
        time.sleep(args.linger_seconds)  # a straggler (evaluation, upload) after the chief is done
    # Training is done and saved: leave without the interpreter's own teardown, where gloo's background
    # threads now and then abort the process ('terminate called without an active exception', SIGABRT)
    # after a clean finish, which torchrun counts as a failure and restarts (seen in CI on torch 2.13).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
