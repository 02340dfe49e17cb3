"""examples/train_inplace.py's training on torchft: one replica group of one process, the same model, data and loss.

Why a twin: bench/hot.py compares recovery from the same faults on the same machine, so torchft must train what
ours trains (`build_model`, `dataset`, `loss_of`, SGD with momentum, imported from the example, not copied) and
print what bench/agentjob.py reads:

  started rank=<replica> world_size=1 resumed_from=<step>      once, when the Manager exists
  step=<n> loss=<f> world_size=<participants> restart=<quorum id> time=<unix>
      per committed step (`should_commit()` was true), from the replica whose participating rank is 0: one
      printer per quorum, as rank 0 is ours; <n> is `manager.current_step()`
  spare ready pid=<pid>                                        with --spare-file: imported, model built, waiting

Each replica group is one process with its own TCPStore (rank 0 of world size 1), a `torchft.Manager` on
`ProcessGroupGloo` with `min_replica_size=1`, the state (model, optimizer, steps applied) handed to a newcomer
through the Manager's `state_dict`/`load_state_dict`, and `torchft.optim.OptimizerWrapper`, which starts the
quorum in `zero_grad()` and steps only when the step commits. Gradients are averaged by one
`manager.allreduce(grad).wait()` per parameter; `--ddp` uses torchft's `DistributedDataParallel` instead.

With `--spare-file` the process imports torch and torchft, builds its model and waits for that file: the
bench creates it at a kill, and only then does the spare create its Manager and join (a warm replacement).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the repo root (examples, bench) is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

import torch
from torch import nn
from torch.distributed import TCPStore
from torchft import Manager, ProcessGroupGloo
from torchft.ddp import DistributedDataParallel
from torchft.optim import OptimizerWrapper

from examples.train_inplace import build_model, dataset, loss_of, say

SPARE_POLL_SECONDS = 0.005  # a spare looks for its file this often: a few ms added to its start, no CPU to speak of


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replica", type=int, required=True, help="this replica group's number (its replica_id)")
    parser.add_argument("--lighthouse", required=True, help="the lighthouse's address, http://host:port")
    parser.add_argument("--timeout", type=float, default=60.0, help="gloo's and the Manager's timeout, s (torchft "
                        "default 60)")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--hidden", type=int, default=64, help="hidden width; 3536 gives 100 MB of state")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="extra time per step (a slower model)")
    parser.add_argument("--dataset-size", type=int, default=2048, help="samples in the (synthetic) dataset")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per replica per step")
    parser.add_argument("--seed", type=int, default=0, help="the model's initial weights and the data")
    parser.add_argument("--spare-file", type=Path, help="wait for this file before joining (a warm spare)")
    parser.add_argument("--ddp", action="store_true", help="torchft.ddp.DistributedDataParallel instead of one "
                        "manager.allreduce per gradient")
    return parser.parse_args()


def batch(step: int, rank: int, participants: int, size: int, dataset_size: int) -> list[int]:
    """This replica's samples of a step: consecutive slices of the dataset, one per participant.

    A replica that heals in this step is no participant (rank None): it reads slice 0, and torchft zeroes its
    gradients in the all-reduce anyway.
    """
    start = (step * participants + rank) * size
    return [(start + i) % dataset_size for i in range(size)]


def main() -> None:
    args = parse_args()
    data = dataset(args.dataset_size, args.seed)
    model = build_model(args.hidden, args.seed)
    inner = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    applied = torch.zeros((), dtype=torch.int64)  # optimizer steps applied to this state: must equal the step

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optimizer": inner.state_dict(), "applied": applied.clone()}

    def load_state_dict(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optimizer"])
        applied.copy_(state["applied"])

    if args.spare_file is not None:
        say(f"spare ready pid={os.getpid()}")
        while not args.spare_file.exists():
            time.sleep(SPARE_POLL_SECONDS)

    timeout = timedelta(seconds=args.timeout)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # this replica group's own
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout), load_state_dict=load_state_dict, state_dict=state_dict,
        min_replica_size=1, timeout=timeout, rank=0, world_size=1, store_addr="127.0.0.1", store_port=store.port,
        lighthouse_addr=args.lighthouse, replica_id=f"replica_{args.replica}",
    )
    optimizer = OptimizerWrapper(manager, inner)
    net: nn.Module = DistributedDataParallel(manager, model) if args.ddp else model
    say(f"started rank={args.replica} world_size=1 resumed_from={manager.current_step()}")

    while manager.current_step() < args.steps:
        optimizer.zero_grad()  # starts the quorum (in the background)
        participants = manager.num_participants()  # waits for it
        rank = manager.participating_rank()
        step = manager.current_step()
        ids = batch(step, rank or 0, participants, args.batch_size, args.dataset_size)
        loss = loss_of(net, data, ids, participants * args.batch_size, participants)
        loss.backward()
        time.sleep(args.step_seconds)
        if not args.ddp:
            for p in model.parameters():
                manager.allreduce(p.grad).wait()
        before = manager.current_step()  # after a heal: the step it healed to
        optimizer.step()
        if manager.current_step() == before:
            continue  # not committed: the optimizer did not step
        applied += 1
        if rank == 0:
            # torchft has no public accessor for the quorum id; the bench tells rounds apart by it
            say(f"step={manager.current_step()} loss={loss.item():.4f} world_size={participants} "
                f"restart={manager._quorum_id} time={time.time():.3f}")
    manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: gloo's and torchft's threads may abort it (as in train_inplace.py)
