"""Data-parallel training that survives membership changes in place (`recovery: InPlace`).

Run under `elastic agent --recovery=in-place` (or a spec with `recovery: InPlace`) a worker crash, a lost
node or a new node costs about a second: survivors keep their processes and their state, a replacement is
a fork of a warm process and receives the state from a survivor. Under stock torchrun it trains the same
way, with torchrun's restarts. The training loop with `elastic.train.Session`:

    with Session(state_dict, load_state_dict, step=resumed_step) as session:
        for step in session.steps(args.steps):
            loss = loss_of(model, batch(step, session.rank))
            loss.backward()
            if session.allreduce_gradients(model):  # False: the group changed, redo this step
                optimizer.step()
                session.commit(loss.item())
            optimizer.zero_grad()

Printed (a stable format, parsed by tests and bench/): each process prints `started rank=<r> world_size=<w>
resumed_from=<step>` once; rank 0 prints `step=<n> loss=<f> world_size=<w> restart=<round> time=<unix>` per
step (and with `--checkpoint-dir` saves every `--checkpoint-every` steps, which every process loads at
start: the restart modes resume from it; in place the state comes from a live peer); every rank prints
`recovered round=<r> rank=<k> world_size=<w> wait_round=<s> process_group=<s> state_transfer=<s> bytes=<n>
source=<rank> pid=<pid> time=<unix>` after each change, and `done step=<n> applied=<n> checksum=<f> pid=<pid>`
at the end; `--crash-at-step` prints `crashing rank=<r> step=<n> pid=<pid> time=<unix>` as it exits.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from elastic.train import Session

INPUT_DIM, NUM_CLASSES, BATCH_SIZE = 16, 4, 32


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--hidden", type=int, default=64, help="hidden width; 3536 gives 100 MB of state")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="extra time per step (a slower model)")
    parser.add_argument("--crash-at-step", type=int, help="the worker with rank 1 exits 1 at this step, once")
    parser.add_argument("--crash-marker", default="", help="file made at the crash: no crash if it exists "
                        "(relative: in $ELASTIC_CHECKPOINT_DIR or --checkpoint-dir when set)")
    parser.add_argument("--checkpoint-dir", type=Path, help="rank 0 saves here; every process loads it at start")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps between saves (default 20)")
    return parser.parse_args()


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic data per (step, rank): no sampler state to hand over when the world changes."""
    generator = torch.Generator().manual_seed(step * 100_003 + rank)
    x = torch.randn(BATCH_SIZE, INPUT_DIM, generator=generator)
    return x, (x[:, :NUM_CLASSES].argmax(dim=1))


def maybe_crash(args: argparse.Namespace, step: int, rank: int) -> None:
    if args.crash_at_step != step or rank != 1:
        return
    marker = Path(args.crash_marker) if args.crash_marker else None
    run_dir = os.environ.get("ELASTIC_CHECKPOINT_DIR") or args.checkpoint_dir
    if marker is not None and not marker.is_absolute() and run_dir:
        marker = Path(run_dir) / marker  # a relative marker lives with the run, not in the script's directory
    if marker is not None:
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch(exist_ok=False)
        except FileExistsError:
            return
    print(f"crashing rank={rank} step={step} pid={os.getpid()} time={time.time():.3f}", flush=True)
    os._exit(1)


def checkpoint_path(args: argparse.Namespace) -> Path | None:
    return args.checkpoint_dir / "checkpoint.pt" if args.checkpoint_dir else None


def save_checkpoint(path: Path, step: int, state: dict[str, Any]) -> None:
    """Atomically: a process that starts while rank 0 writes reads the previous checkpoint, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    torch.save({"step": step, "state": state}, partial)
    os.replace(partial, path)


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(INPUT_DIM, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden),
                          nn.ReLU(), nn.Linear(args.hidden, NUM_CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    applied = torch.zeros((), dtype=torch.int64)  # steps applied to this state: must equal the step count

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "applied": applied}

    def load_state_dict(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        applied.copy_(state["applied"])

    path, resumed_step = checkpoint_path(args), 0
    if path is not None and path.exists():
        saved = torch.load(path, weights_only=True)
        load_state_dict(saved["state"])
        resumed_step = int(saved["step"])
    print(f"started rank={os.environ.get('RANK', 0)} world_size={os.environ.get('WORLD_SIZE', 1)} "
          f"resumed_from={resumed_step}", flush=True)

    with Session(state_dict, load_state_dict, step=resumed_step) as session:
        reported_round = None
        for step in session.steps(args.steps):
            if session.in_place and session.round != reported_round:
                reported_round, r = session.round, session.last_recovery
                print(f"recovered round={session.round} rank={session.rank} world_size={session.world_size} "
                      f"wait_round={r.wait_round:.4f} process_group={r.process_group:.4f} "
                      f"state_transfer={r.state_transfer:.4f} bytes={r.received_bytes} source={r.source} "
                      f"pid={os.getpid()} time={time.time():.3f}", flush=True)
            maybe_crash(args, step, session.rank)
            x, y = batch(step, session.rank)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            time.sleep(args.step_seconds)
            if session.allreduce_gradients(model):
                optimizer.step()
                applied += 1
                session.commit(loss.item())
                if session.rank == 0:
                    print(f"step={step} loss={loss.item():.4f} world_size={session.world_size} "
                          f"restart={session.round} time={time.time():.3f}", flush=True)
                    if path is not None and session.step % args.checkpoint_every == 0:
                        save_checkpoint(path, session.step, state_dict())
            optimizer.zero_grad()
        checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
        print(f"done step={session.step} applied={int(applied)} checksum={checksum:.6f} pid={os.getpid()}",
              flush=True)


if __name__ == "__main__":
    main()
