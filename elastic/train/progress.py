"""Rank 0's progress in etcd (`ELASTIC_PROGRESS_KEY`, set by the controller): what `elastic status`, the
live view and the metrics show as step, loss, world size and ETA.

Best effort and cheap: at most one write a second, short retries, and a failure is logged once and never
stops the training (etcd being away must not cost steps).
"""

from __future__ import annotations

import os
import sys
import time

from elastic.codec import ProgressRecord
from elastic.store import EtcdAuth, GatewayStore

PROGRESS_KEY = "ELASTIC_PROGRESS_KEY"
ENDPOINTS = "ELASTIC_ETCD_ENDPOINTS"
INTERVAL_SECONDS = 1.0


class ProgressReporter:
    def __init__(self, key: str | None = None, endpoints: str | None = None) -> None:
        self.key = key if key is not None else os.environ.get(PROGRESS_KEY)
        self.endpoints = endpoints if endpoints is not None else os.environ.get(ENDPOINTS)
        self._store: GatewayStore | None = None
        self._last = 0.0
        self._warned = False

    def report(self, step: int, loss: float | None, world_size: int, total: int | None, final: bool = False) -> None:
        if not (self.key and self.endpoints):
            return
        now = time.monotonic()
        if not final and now - self._last < INTERVAL_SECONDS:
            return
        self._last = now
        record = ProgressRecord(step=step, loss=loss, world_size=world_size, total=total, at=time.time())
        try:
            if self._store is None:
                self._store = GatewayStore(self.endpoints, timeout=1.0, retry_seconds=1.0, auth=EtcdAuth.from_env())
            self._store.put(self.key, record.model_dump_json(exclude_none=True))
        except Exception as err:  # any failure: say it once, keep training
            if not self._warned:
                self._warned = True
                print(f"elastic.train: progress report to {self.key!r} failed (not logged again): {err}",
                      file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
