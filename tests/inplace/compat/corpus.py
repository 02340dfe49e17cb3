"""The training loop every script of the compatibility corpus shares.

Scripts import it from their own directory, which is `sys.path[0]` under any launcher (that much of the
script's identity is checked by every case). A script prints what it observed as `result KEY=VALUE` lines
and writes files under `--out` (relative to the working directory); the test compares both between stock
torchrun and an in-place agent. Rank 1 exits 1 once at `--crash-at-step` (a marker file under `--out`
makes it once per job), so every case also runs its checks again in a replacement (in place) or in a
restarted worker (torchrun).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from elastic.train import Session

FEATURES, CLASSES, SAMPLES, BATCH = 8, 2, 64, 8


def arguments() -> argparse.ArgumentParser:
    """The corpus's own arguments, as a parent parser for scripts that take more."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--crash-at-step", type=int, default=-1)
    parser.add_argument("--out", type=Path, default=Path("out"))
    return parser


def parse_args() -> argparse.Namespace:
    return argparse.ArgumentParser(parents=[arguments()]).parse_args()


def emit(key: str, value: object) -> None:
    """One observation; the test compares the set of them between launchers. One write, so that the lines
    of two ranks sharing the agent's output never interleave (print writes the newline apart)."""
    sys.stdout.write(f"result {key}={value}\n")
    sys.stdout.flush()


def rank_dataset() -> TensorDataset:
    """This rank's share of a fixed dataset (data parallel: rank r takes every world_size-th sample)."""
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    y = (x[:, 0] > 0).long()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return TensorDataset(x[rank::world], y[rank::world])


class StepBatches:
    """Batch `step` of a shuffled loader: epoch `step // batches`, shuffled by a generator seeded with the
    epoch, so any process (a restarted one, a replacement) finds the same batch for the same step."""

    def __init__(self, make_loader: Callable[[torch.Generator], DataLoader]) -> None:
        self.make_loader = make_loader
        self.next_step = -1
        self.batches: Iterator[list[torch.Tensor]] = iter(())

    def __call__(self, step: int) -> list[torch.Tensor]:
        per_epoch = SAMPLES // BATCH // int(os.environ["WORLD_SIZE"])
        epoch, index = divmod(step, per_epoch)
        if index == 0 or step != self.next_step:
            self.batches = iter(self.make_loader(torch.Generator().manual_seed(epoch)))
            for _ in range(index):
                next(self.batches)
        self.next_step = step + 1
        return next(self.batches)


def plain_loader(dataset: TensorDataset) -> Callable[[torch.Generator], DataLoader]:
    """A shuffled loader without worker processes (for scripts whose subject is elsewhere)."""
    return lambda generator: DataLoader(dataset, batch_size=BATCH, shuffle=True, generator=generator)


def exit_once(args: argparse.Namespace, step: int, rank: int) -> None:
    """Rank 1 dies at `--crash-at-step`, once per job, without Python's own exit."""
    if not first_crash(args, step, rank):
        return
    # No flush: the line reaches the log only if stdout is unbuffered (PYTHONUNBUFFERED, as the harness
    # sets for torchrun too).
    print(f"crashing rank={rank} step={step} pid={os.getpid()}")
    os._exit(1)


def raise_once(args: argparse.Namespace, step: int, rank: int) -> None:
    """Rank 1 raises at `--crash-at-step`, once per job: the error leaves the script's main()."""
    if first_crash(args, step, rank):
        print(f"crashing rank={rank} step={step} pid={os.getpid()}", flush=True)
        raise RuntimeError(f"injected crash at step {step}")


def first_crash(args: argparse.Namespace, step: int, rank: int) -> bool:
    if step != args.crash_at_step or rank != 1:
        return False
    try:
        (args.out / "crashed").touch(exist_ok=False)
    except FileExistsError:
        return False
    return True


def train(args: argparse.Namespace, batch_at: Callable[[int], list[torch.Tensor]],
          checks: Callable[[], None] = lambda: None,
          crash: Callable[[argparse.Namespace, int, int], None] = exit_once,
          forward: Callable[[nn.Module], Callable[[torch.Tensor], torch.Tensor]] = lambda net: net) -> None:
    """Data-parallel SGD under `Session`; `checks` run once the session holds its process group (and, in
    place, its etcd watch), in every process that starts the script: a replacement too. `forward` wraps
    the model for its forward pass (`torch.compile`)."""
    torch.manual_seed(0)
    net = nn.Linear(FEATURES, CLASSES)
    model = forward(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)

    def state_dict() -> dict:
        return {"model": net.state_dict(), "optimizer": optimizer.state_dict()}

    def load_state_dict(state: dict) -> None:
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    with Session(state_dict, load_state_dict) as session:
        checks()
        for step in session.steps(args.steps):
            crash(args, step, session.rank)
            x, y = batch_at(step)
            F.cross_entropy(model(x), y).backward()
            if session.allreduce_gradients(net):
                optimizer.step()
                session.commit()
            optimizer.zero_grad()
        checksum = sum(float(p.detach().double().sum()) for p in net.parameters())
        emit(f"checksum.rank{session.rank}", f"{checksum:.6f}")
