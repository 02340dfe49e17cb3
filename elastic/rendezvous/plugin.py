"""The `torchrun.handlers` entry point: `torchrun --rdzv-backend=etcd-v3` finds this (torch >= 2.6)."""

from __future__ import annotations

from collections.abc import Callable

from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    from elastic.rendezvous.config import RendezvousConfig
    from elastic.rendezvous.handler import EtcdV3RendezvousHandler

    return EtcdV3RendezvousHandler(RendezvousConfig.from_parameters(params))


def handler_creator() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """torch calls the entry point with no arguments and expects the creator back."""
    return create_handler
