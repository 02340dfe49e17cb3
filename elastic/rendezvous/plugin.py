"""The `torchrun.handlers` entry point: `torchrun --rdzv-backend=etcd-v3` finds this (torch >= 2.6).

Nothing from torch is imported at module level. torch registers out-of-tree handlers while its own
`torch.distributed.elastic.rendezvous` package initialises, by loading this entry point; if this module
imported that package at its top, then `import elastic.rendezvous.plugin` *before* torch's package would
make torch load this module while it is still half-initialised (no `handler_creator` yet), log a warning,
and leave `etcd-v3` unregistered for the whole process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    from elastic.rendezvous.config import RendezvousConfig
    from elastic.rendezvous.handler import EtcdV3RendezvousHandler

    return EtcdV3RendezvousHandler(RendezvousConfig.from_parameters(params))


def handler_creator() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """torch calls the entry point with no arguments and expects the creator back."""
    return create_handler
