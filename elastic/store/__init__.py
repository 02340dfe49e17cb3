"""The store layer: the only code that talks to etcd (client, leases, watches, key layout, local server).

`Store` (gRPC) and `LeaseKeeper` are imported on first use: a training process imports this package for the
key layout, the transaction vocabulary and `GatewayStore`, and must never import gRPC (docs/design.md,
"Fork safety").
"""

from typing import TYPE_CHECKING, Any

from elastic.store.auth import EtcdAuth, StoreAccessError
from elastic.store.base import StoreBase
from elastic.store.gateway import GatewayStore
from elastic.store.keys import JobKeys
from elastic.store.ops import (
    Delete,
    Entry,
    ModRevisionIs,
    Put,
    TxnResult,
    UnchangedSince,
    ValueIs,
    dumps,
)
from elastic.store.watch import PrefixWatch, WatchEvent

if TYPE_CHECKING:
    from elastic.store.client import Store
    from elastic.store.lease import LeaseKeeper

_GRPC_NAMES = {"Store": "elastic.store.client", "LeaseKeeper": "elastic.store.lease"}


def __getattr__(name: str) -> Any:
    if name in _GRPC_NAMES:
        import importlib

        return getattr(importlib.import_module(_GRPC_NAMES[name]), name)
    raise AttributeError(f"module 'elastic.store' has no attribute {name!r}")


__all__ = [
    "Delete",
    "Entry",
    "EtcdAuth",
    "GatewayStore",
    "JobKeys",
    "LeaseKeeper",
    "ModRevisionIs",
    "PrefixWatch",
    "Put",
    "Store",
    "StoreAccessError",
    "StoreBase",
    "TxnResult",
    "UnchangedSince",
    "ValueIs",
    "WatchEvent",
    "dumps",
]
