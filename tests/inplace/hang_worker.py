"""A worker whose rank 1 stops making progress (outside any collective) at one step, once: for the hang test."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from elastic.train import Session

steps, hang_at, marker = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
weight = torch.nn.Parameter(torch.zeros(4))
with Session(lambda: {"w": weight.detach().clone()}, lambda s: weight.data.copy_(s["w"])) as session:
    for step in session.steps(steps):
        if step == hang_at and session.rank == 1 and not marker.exists():
            marker.touch()
            print(f"hanging rank=1 step={step}", flush=True)
            time.sleep(3600)
        (weight * torch.ones(4)).sum().backward()
        time.sleep(0.02)
        if session.allreduce_gradients([weight]):
            weight.data -= 0.1 * weight.grad
            session.commit()
        weight.grad = None
    print(f"done step={session.step} rank={session.rank} w={weight.sum().item():.4f}", flush=True)
