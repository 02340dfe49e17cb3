"""A plain DDP script whose global rank 1 raises ValueError at step 5: a real bug on one worker.

Its peer's all-reduce then breaks ("Connection closed by peer") and exits 1 as well, within milliseconds:
the job must still name the raising worker and show its ValueError (docs/design.md §3.16). No `@record`:
the error is read from the worker's stderr, the harder path.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, 100_000):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} rank {rank} pid {os.getpid()}", flush=True)
        if step == 5 and rank == 1:
            raise ValueError(f"bad batch at step {step} on rank {rank}")
        time.sleep(0.02)


if __name__ == "__main__":
    main()
