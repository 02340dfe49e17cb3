"""The store layer: the only code that talks to etcd (client, leases, watches, key layout, local server)."""

from elastic.store.client import (
    Delete,
    Entry,
    ModRevisionIs,
    Put,
    Store,
    TlsOptions,
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
    "JobKeys",
    "LeaseKeeper",
    "ModRevisionIs",
    "PrefixWatch",
    "Put",
    "Store",
    "TlsOptions",
    "TxnResult",
    "UnchangedSince",
    "ValueIs",
    "WatchEvent",
    "dumps",
]
