"""The store layer: the only code that talks to etcd (client, leases, watches, key layout, local server)."""

from elastic.store.auth import EtcdAuth, StoreAccessError
from elastic.store.client import (
    Delete,
    Entry,
    ModRevisionIs,
    Put,
    Store,
    TxnResult,
    UnchangedSince,
    ValueIs,
    dumps,
)
from elastic.store.keys import JobKeys
from elastic.store.lease import LeaseKeeper
from elastic.store.watch import PrefixWatch, WatchEvent

__all__ = [
    "Delete",
    "Entry",
    "EtcdAuth",
    "JobKeys",
    "LeaseKeeper",
    "ModRevisionIs",
    "PrefixWatch",
    "Put",
    "Store",
    "StoreAccessError",
    "TxnResult",
    "UnchangedSince",
    "ValueIs",
    "WatchEvent",
    "dumps",
]
