"""The store layer: the only code that talks to etcd (client, leases, watches, key layout, local server).

`Store` (gRPC: controllers, the CLI) is imported on first use: agents and training processes use
`GatewayStore` and must never import gRPC, since they fork (docs/design.md, "Fork safety").
"""

from typing import TYPE_CHECKING, Any

from elastic.store.auth import EtcdAuth, StoreAccessError
from elastic.store.base import StoreBase
from elastic.store.gateway import GatewayStore
from elastic.store.keys import JobKeys
from elastic.store.lease import LeaseKeeper
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


def __getattr__(name: str) -> Any:
    if name == "Store":
        from elastic.store.client import Store

        return Store
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
