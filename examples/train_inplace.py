"""Data-parallel training that survives membership changes in place (`recovery: InPlace`).

Run under `elastic agent --recovery=in-place` (or a spec with `recovery: InPlace`) a worker crash, a lost
node or a new node costs about a second: survivors keep their processes and their state, a replacement is
a fork of a warm process and receives the state from a survivor. Under stock torchrun it trains the same
way, with torchrun's restarts. The training loop with `elastic.train.Session` and `ElasticSampler`:

    sampler = ElasticSampler(len(dataset), batch_size, seed=seed)
    session = Session(state={"model": model, "optimizer": optimizer, "sampler": sampler})
    with session:
        for step in session.steps(args.steps):
            ids = sampler.indices(session.rank, session.world_size)
            loss = loss_of(model, ids, sampler.step_samples(session.world_size), session.world_size)
            loss.backward()
            if session.allreduce_gradients(model):  # False: the group changed, redo this step
                optimizer.step()
                session.commit(loss.item())           # the sampler moves on with the step
            optimizer.zero_grad()

With `--ddp` the model is a DistributedDataParallel module; with `--hsdp 2` it is sharded by FSDP2 over
replicas of 2 ranks (`fully_shard` on `session.device_mesh`, the replicas averaged by `session.replicate`),
and each rank's shard travels from its holder in another replica.

The session hands the model, the optimizer, the sampler's position and the RNG states to a replacement,
and `session.state_dict()` is the checkpoint: whatever the world sizes, every sample of an epoch is read
once, by one rank, in the committed steps.

Printed (a stable format, parsed by tests and bench/): each process prints `started rank=<r> world_size=<w>
resumed_from=<step>` once; rank 0 prints `step=<n> loss=<f> world_size=<w> restart=<round> time=<unix>` per
step (and with `--checkpoint-dir` saves every `--checkpoint-every` steps, which every process loads at
start: the restart modes resume from it; in place the state comes from a live peer); every rank prints
`recovered round=<r> rank=<k> world_size=<w> wait_round=<s> process_group=<s> state_transfer=<s> bytes=<n>
source=<rank> pid=<pid> time=<unix>` after each change, and `done step=<n> applied=<n> checksum=<f> pid=<pid>`
at the end; `--crash-at-step` prints `crashing rank=<r> step=<n> pid=<pid> time=<unix>` as it exits;
`--log-samples` makes every rank print `reads step=<n> round=<r> epoch=<e> rank=<k> world_size=<w>
ids=<i,j,...>` before each attempt of a step (an attempt the group drops is read again in the next round).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard

from elastic.train import DistributedDataParallel, ElasticSampler, Session
from elastic.train.checkpoint import publish

INPUT_DIM, NUM_CLASSES = 16, 4


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
    parser.add_argument("--dataset-size", type=int, default=2048, help="samples in the (synthetic) dataset")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    parser.add_argument("--seed", type=int, default=0, help="the model's initial weights, the data and its order")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="the model's and data's type (float64: runs compare to the last bits)")
    parser.add_argument("--log-samples", action="store_true", help="every rank prints the ids it reads per step")
    parser.add_argument("--save-final", type=Path, help="rank 0 saves the final model's state_dict here")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the model trains (cuda: "
                        "GPU number RANK modulo the GPUs there are)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), help="the training group's backend (default: nccl "
                        "on cuda, gloo on cpu; in place the commit gate and the handover always use gloo)")
    parser.add_argument("--ddp", action="store_true", help="wrap the model in DistributedDataParallel (DDP's own "
                        "bucketed all-reduce and the session's commit gate) instead of session.allreduce_gradients")
    parser.add_argument("--hsdp", type=int, metavar="SHARD_SIZE", help="shard the model with FSDP2 over replicas of "
                        "SHARD_SIZE ranks (HSDP: the world is replicas x SHARD_SIZE; each layer is fully_shard()ed)")
    args = parser.parse_args()
    if args.hsdp and (args.ddp or args.checkpoint_dir):
        parser.error("--hsdp: a sharded model is neither a DDP module nor saved whole by rank 0 (drop --ddp and "
                     "--checkpoint-dir)")
    return args


def dataset(size: int, seed: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """A synthetic dataset of `size` distinct samples (inputs, labels), the same in every process."""
    x = torch.randn(size, INPUT_DIM, generator=torch.Generator().manual_seed(seed))
    return x.to(dtype), x[:, :NUM_CLASSES].argmax(dim=1)


def build_model(hidden: int, seed: int, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(INPUT_DIM, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, NUM_CLASSES)).to(dtype)


def loss_of(model: nn.Module, data: tuple[torch.Tensor, torch.Tensor], ids: list[int], step_samples: int,
            world_size: int) -> torch.Tensor:
    """This rank's share of the step's mean loss: its samples' summed loss x world_size / the job's samples,
    which the gradient average (a sum / world_size) turns into the mean over every sample of the step, even
    when the ranks read unequal parts (an epoch's last step; a rank may read none)."""
    x, y = data
    index = torch.tensor(ids, dtype=torch.int64, device=x.device)
    return nn.functional.cross_entropy(model(x[index]), y[index], reduction="sum") * (world_size / step_samples)


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
    say(f"crashing rank={rank} step={step} pid={os.getpid()} time={time.time():.3f}")
    os._exit(1)


def say(line: str) -> None:
    """One write per line: the workers of one agent share its log, and print's separate write of the newline
    let two ranks' lines run together now and then (two `done` lines read as one)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def checkpoint_path(args: argparse.Namespace) -> Path | None:
    return args.checkpoint_dir / "checkpoint.pt" if args.checkpoint_dir else None


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Atomically: a process that starts while rank 0 writes reads the previous checkpoint, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    torch.save(state, partial)
    publish(partial, path)  # fenced: a worker whose round has ended cannot replace it


def shard(model: nn.Module, session: Session, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """HSDP: each Linear, then the whole, fully_shard()ed on the session's mesh, the replicas' gradients
    averaged by the session, and an optimizer like `optimizer` over the sharded parameters (a replacement
    receives both from its shard's survivor)."""
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=session.device_mesh)
    fully_shard(model, mesh=session.device_mesh)
    session.replicate(model)
    optimizer = type(optimizer)(model.parameters(), **optimizer.defaults)
    session.register("model", model)
    session.register("optimizer", optimizer)
    return optimizer


def main() -> None:
    args = parse_args()
    dtype = getattr(torch, args.dtype)
    # One GPU per rank where there are enough (the bench runs one worker per agent, all LOCAL_RANK 0).
    device = (torch.device("cuda", int(os.environ.get("RANK", 0)) % torch.cuda.device_count())
              if args.device == "cuda" else None)
    if device is not None:
        torch.cuda.set_device(device)
    data = tuple(t.to(device) for t in dataset(args.dataset_size, args.seed, dtype))
    model = build_model(args.hidden, args.seed, dtype).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = ElasticSampler(args.dataset_size, args.batch_size, seed=args.seed)
    applied = torch.zeros((), dtype=torch.int64)  # steps applied to this state: must equal the step count
    # HSDP: the model and its optimizer join the state once sharded, on the mesh the session has in its round.
    whole = {} if args.hsdp else {"model": model, "optimizer": optimizer}
    session = Session(state={**whole, "sampler": sampler, "applied": applied}, shard_size=args.hsdp,
                      backend=args.backend or ("nccl" if device is not None else "gloo"))

    path = checkpoint_path(args)
    if path is not None and path.exists():
        session.load_state_dict(torch.load(path, weights_only=True))
    say(f"started rank={os.environ.get('RANK', 0)} world_size={os.environ.get('WORLD_SIZE', 1)} "
        f"resumed_from={session.step}")

    with session:
        if args.hsdp:
            optimizer = shard(model, session, optimizer)
        net = DistributedDataParallel(model, process_group=session.process_group,
                                      device_ids=None if device is None else [device.index]) if args.ddp else model
        reported_round = None
        for step in session.steps(args.steps):
            if session.in_place and session.round != reported_round:
                reported_round, r = session.round, session.last_recovery
                say(f"recovered round={session.round} rank={session.rank} world_size={session.world_size} "
                    f"wait_round={r.wait_round:.4f} process_group={r.process_group:.4f} "
                    f"state_transfer={r.state_transfer:.4f} bytes={r.received_bytes} source={r.source} "
                    f"pid={os.getpid()} time={time.time():.3f}")
            maybe_crash(args, step, session.rank)
            ids = sampler.indices(session.rank, session.world_size)
            if args.log_samples:
                say(f"reads step={step} round={session.round} epoch={sampler.epoch} rank={session.rank} "
                    f"world_size={session.world_size} ids={','.join(map(str, ids))}")
            loss = loss_of(net, data, ids, sampler.step_samples(session.world_size), session.world_size)
            loss.backward()
            time.sleep(args.step_seconds)
            if session.should_commit() if args.ddp or args.hsdp else session.allreduce_gradients(model):
                optimizer.step()
                applied += 1
                session.commit(loss.item())
                if session.rank == 0:
                    say(f"step={step} loss={loss.item():.4f} world_size={session.world_size} "
                        f"restart={session.round} time={time.time():.3f}")
                    if path is not None and session.step % args.checkpoint_every == 0:
                        save_checkpoint(path, session.state_dict())
            optimizer.zero_grad()
        final = {k: v.full_tensor() if args.hsdp else v for k, v in model.state_dict().items()}  # every rank
        checksum = sum(float(v.double().sum()) for v in final.values())
        say(f"done step={session.step} applied={int(applied)} checksum={checksum:.6f} pid={os.getpid()}")
        if args.save_final is not None and session.rank == 0:
            torch.save(final, args.save_final)


if __name__ == "__main__":
    main()
    # Training is done and saved: leave without the interpreter's own teardown, where gloo's background
    # threads now and then abort the process after a clean finish (SIGABRT, 'terminate called without an
    # active exception'), which torchrun counts as a failure (seen in CI on torch 2.13, as in train_ddp.py).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
