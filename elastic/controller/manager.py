"""`elastic controller`: every submitted job in one etcd, each driven by its own JobController."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from elastic.cluster.local import LocalProcesses
from elastic.controller.loop import JobController
from elastic.controller.status import FINAL_PHASES
from elastic.controller.submit import list_jobs
from elastic.spec import ElasticJob
from elastic.store import JobKeys, Store

log = logging.getLogger(__name__)


class LocalControllerManager:
    def __init__(self, store: Store, endpoints: str, log_root: Path) -> None:
        self.store = store
        self.endpoints = endpoints
        self.log_root = log_root
        self.controllers: dict[str, JobController] = {}

    def controller_for(self, job: ElasticJob) -> JobController:
        keys = JobKeys(job.metadata.namespace, job.metadata.name)
        workers = LocalProcesses(self.store, keys, self.log_root / job.metadata.namespace / job.metadata.name)
        return JobController(self.store, job, workers, self.endpoints)

    def step(self, on_status: Callable[[str, dict], None] | None = None) -> None:
        for job in list_jobs(self.store):
            if job.key not in self.controllers:
                status = self.store.get_json(JobKeys(job.metadata.namespace, job.metadata.name).status) or {}
                if status.get("phase") in FINAL_PHASES and not self.store.get_prefix(
                    JobKeys(job.metadata.namespace, job.metadata.name).workers_prefix
                )[0]:
                    continue
                self.controllers[job.key] = self.controller_for(job)
        for key, controller in list(self.controllers.items()):
            status = controller.step()
            if on_status is not None:
                on_status(key, status)
            if controller.done():
                controller.finish()
                del self.controllers[key]

    def run_forever(self, on_status: Callable[[str, dict], None] | None = None, period: float = 0.3) -> None:
        while True:
            self.step(on_status)
            time.sleep(period)
