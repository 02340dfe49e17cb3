"""Moving the job's state from a live peer to the ranks that lack it, over the new process group.

A replacement or newcomer gets the model and optimizer state from a survivor in memory (no checkpoint file
is read): the state is serialised once by `torch.save` into one byte tensor and sent whole, so its layout
need not be known in advance (a fresh optimizer has no state tensors to receive into yet).
"""

from __future__ import annotations

import io
from typing import Any

import torch
import torch.distributed as dist

from elastic.policy.state_source import Report, TransferPlan


def exchange_reports(step: int, holds_state: bool, world_size: int) -> list[Report]:
    mine = torch.tensor([step, int(holds_state)], dtype=torch.int64)
    gathered = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(gathered, mine)
    return [Report(int(t[0]), bool(t[1])) for t in gathered]


def move_state(plan: TransferPlan, rank: int, world_size: int, state: dict[str, Any] | None) -> bytes | None:
    """Run this rank's part of `plan`; the receivers get the serialised state back (others None).

    `state` is needed on the source only. The caller deserialises outside any collective (see `load`).
    """
    if not plan.receivers or (rank != plan.source and rank not in plan.receivers):
        return None
    payload = _serialise(state) if rank == plan.source else None
    size = torch.tensor([payload.numel() if payload is not None else 0], dtype=torch.int64)
    if plan.broadcast(world_size):
        dist.broadcast(size, src=plan.source)
        buffer = payload if payload is not None else torch.empty(int(size), dtype=torch.uint8)
        dist.broadcast(buffer, src=plan.source)
    elif payload is not None:
        for receiver in plan.receivers:
            dist.send(size, dst=receiver)
            dist.send(payload, dst=receiver)
        return None
    else:
        dist.recv(size, src=plan.source)
        buffer = torch.empty(int(size), dtype=torch.uint8)
        dist.recv(buffer, src=plan.source)
    return None if rank == plan.source else buffer.numpy().tobytes()


def load(data: bytes) -> dict[str, Any]:
    # weights_only: a peer's bytes are read like a checkpoint, with torch's safe loader.
    return torch.load(io.BytesIO(data), weights_only=True)


def _serialise(state: dict[str, Any] | None) -> torch.Tensor:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return torch.frombuffer(bytearray(buffer.getbuffer()), dtype=torch.uint8)
