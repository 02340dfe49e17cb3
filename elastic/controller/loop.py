"""The controller's executor: observe, reconcile, apply each action, write the status; repeat.

It holds no state that matters between steps: everything it needs is re-read from etcd and the
WorkerSet each time, so a controller killed mid-job and started again carries on where it was.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from elastic.cluster import WorkerSet
from elastic.cluster.base import WorkerLaunch, WorkerStartError
from elastic.cluster.external import agents_in
from elastic.codec import CorruptValueError, decode_progress, decode_status
from elastic.controller.launch import agent_command, agent_env
from elastic.controller.metrics_export import ControllerMetrics
from elastic.controller.reconcile import (
    CloseJob,
    ForgetWorker,
    HandleExit,
    InitRun,
    Observed,
    StartWorkers,
    StopWorker,
    reconcile,
    seconds_until_due,
)
from elastic.controller.status import FINAL_PHASES, condition_since, corrupt_status, job_status, parse_timestamp
from elastic.policy.capacity import WAITING_FOR_CAPACITY
from elastic.policy.exits import Action
from elastic.policy.incident import JobEnd
from elastic.rendezvous.protocol import permanent_failure
from elastic.rendezvous.run import JobRun, RunIdMismatchError
from elastic.rendezvous.state import Closed
from elastic.spec import ElasticJob
from elastic.spec.defaults import RUN_TTL_SECONDS
from elastic.store import JobKeys, Put, Store

log = logging.getLogger(__name__)



def run_id_of(job: ElasticJob) -> str:
    """The job's run id: its uid (a fresh one per submission), else its name (a spec written by hand)."""
    return job.metadata.uid or job.metadata.name


class JobController:
    """Drives one ElasticJob until it is final and none of its workers runs."""

    def __init__(
        self,
        store: Store,
        job: ElasticJob,
        workers: WorkerSet,
        endpoints: str,
        process_cap: int | None = None,
        spec_from_store: bool = True,
        metrics: ControllerMetrics | None = None,
        processes_elsewhere: Callable[[], int] = lambda: 0,
        external_workers: bool = False,
    ) -> None:
        """`spec_from_store`: follow the spec in etcd (local and compose: `elastic scale` edits it there). On
        Kubernetes the ElasticJob object is the only truth and its driver sets `job` each pass: a spec in
        etcd, which anyone with etcd access can write, must never choose what a pod runs.
        `external_workers`: the platform runs the workers (`cluster/external.py`); this controller only
        decides and reports the job."""
        self.store = store
        self.job = job
        self.spec_from_store = spec_from_store
        self.workers = workers
        self.endpoints = endpoints
        self.process_cap = process_cap  # the local machine's limit (None: workers run elsewhere, e.g. pods)
        # What the other jobs of this controller run on the same machine: the cap is the machine's, shared.
        self.processes_elsewhere = processes_elsewhere
        self.processes_in_use = 0  # this job's training processes, as of its last step
        self.due_in: float | None = None  # after a step: seconds until time alone may change its decision
        self.metrics = metrics
        self.external_workers = external_workers
        self.keys = JobKeys(job.metadata.namespace, job.metadata.name)
        self.run = JobRun(store, self.keys)
        self.status: dict[str, Any] = self._read_status()
        self._appliers: dict[type, Callable[[Any, Observed], None]] = {
            InitRun: self._init_run,
            StartWorkers: self._start_workers,
            StopWorker: self._stop_worker,
            HandleExit: self._handle_exit,
            ForgetWorker: lambda a, _: self.workers.forget(a.name),
            CloseJob: self._close,
        }

    @property
    def run_id(self) -> str:
        """Agents the platform starts cannot know a submission's uid: they join the run named after the job."""
        return self.job.metadata.name if self.external_workers else run_id_of(self.job)

    def observe(self) -> Observed:
        state = self.run.read()
        if state.spec is not None and self.spec_from_store:  # `elastic scale` edits the spec in etcd
            self.job = state.spec
        started = self.status.get("startTime")
        # External agents are their member keys, in the state just read: derived, not read a second time.
        workers = agents_in(state) if self.external_workers else self.workers.observe()
        return Observed(
            self.job,
            state,
            tuple(workers),
            started_at=parse_timestamp(started) if started else None,
            process_cap=self.process_cap,
            processes_elsewhere=self.processes_elsewhere(),
            capacity_wait_since=condition_since(self.status, WAITING_FOR_CAPACITY),
            external_workers=self.external_workers,
        )

    def _read_status(self) -> dict[str, Any]:
        """The status this controller wrote last; a bad one is rewritten (it is derived, never a source)."""
        entry = self.store.get(self.keys.status)
        if entry is None:
            return {}
        try:
            return decode_status(entry.key, entry.value)
        except CorruptValueError as err:
            log.warning("%s: %s", self.job.key, err)
            return {}

    def _read_progress(self) -> tuple[dict[str, Any] | None, CorruptValueError | None]:
        entry = self.store.get(self.keys.progress)
        if entry is None:
            return None, None
        try:
            return decode_progress(entry.key, entry.value), None
        except CorruptValueError as err:
            return None, err

    def step(self) -> dict[str, Any]:
        observed = self.observe()
        progress, bad_progress = self._read_progress()
        corrupt = observed.state.corruption() or bad_progress
        if corrupt is not None:
            # Nothing is decided on a state that does not decode: no worker started or stopped, no exit
            # classified, nothing charged. The job says why, and carries on once the key is fixed.
            status = corrupt_status(self.status, corrupt, observed.now)
            self._write_status(status)
            self.due_in = None  # only the key's repair, an event, changes anything
            return status
        actions = reconcile(observed)
        for action in actions:
            log.info("%s: %s", self.job.key, action)
            self._appliers[type(action)](action, observed)
        if actions:
            observed = self.observe()
        live = sum(1 for w in observed.workers if w.alive)
        self.processes_in_use = live * observed.job.spec.nproc_per_node
        status = job_status(observed, self.status, progress)
        self._write_status(status)
        self.due_in = seconds_until_due(observed)
        if self.metrics is not None:
            meta = self.job.metadata
            self.metrics.record(meta.namespace, meta.name, self.run_id, observed.state, status)
        return status

    def _write_status(self, status: dict[str, Any]) -> None:
        if status != self.status:
            self.store.put_json(self.keys.status, status)
            self.status = status

    def done(self) -> bool:
        return self.status.get("phase") in FINAL_PHASES and not any(w.alive for w in self.workers.observe())

    def run_until_done(self, on_status: Callable[[dict[str, Any]], None] | None = None, period: float = 0.3) -> dict:
        while True:
            status = self.step()
            if on_status is not None:
                on_status(status)
            if self.done():
                self.finish()
                return status
            time.sleep(period)

    def finish(self) -> None:
        """The job is final and nothing runs: drop the worker records, then start the TTL if any."""
        for worker in self.workers.observe():
            self.workers.forget(worker.name)
        self.expire_after_finish()

    def expire_after_finish(self) -> None:
        """ttlSecondsAfterFinished: the job's own keys (spec, status, progress) go after that long."""
        ttl = self.job.spec.ttl_seconds_after_finished
        if ttl is None:
            return
        lease = self.store.grant(max(ttl, 1))
        entries, _ = self.store.get_prefix(self.keys.prefix)
        keep = [e for e in entries if e.lease == 0 and not e.key.startswith(self.keys.workers_prefix)]
        ops = [Put(e.key, e.value, lease) for e in keep]
        self.store.txn([], ops)
        self.store.delete_prefix(self.keys.workers_prefix)

    # --- appliers ---

    def _init_run(self, _: InitRun, observed: Observed) -> None:
        try:
            self.run.ensure_run(self.run_id, self.job.spec.failure_policy.max_restarts, RUN_TTL_SECONDS)
        except RunIdMismatchError as err:  # external agents came first under a run id of their own: theirs
            log.warning("%s: %s", self.job.key, err)

    def _start_workers(self, action: StartWorkers, observed: Observed) -> None:
        """Start the workers; one the OS refuses fails the job with the OS error (the ones started before it
        are stopped by the wind-down), so a bad workingDir is a job's status, never the controller's crash."""
        taken = {w.name for w in observed.workers}
        for _ in range(action.count):
            name = self._fresh_name(taken)
            try:
                self.workers.start(
                    WorkerLaunch(
                        name,
                        agent_command(self.job, self.endpoints, self.run_id),
                        agent_env(self.job, self.endpoints, self.store.auth),
                        self.job.spec.worker.working_dir,
                    )
                )
            except WorkerStartError as err:
                log.info("%s: %s", self.job.key, err)  # the job's status says it; no second line on stderr
                self.run.close(self.run.read(), Closed(JobEnd.WORKER_START_FAILED.value, str(err), time.time()))
                return

    def _fresh_name(self, taken: set[str]) -> str:
        """A worker name no worker of this job has now (16 random bits: short for people and pod names, drawn
        again on a clash rather than left to the API server's 409 or to a local log overwritten)."""
        while True:
            name = f"{self.job.metadata.name}-{secrets.token_hex(2)}"
            if name not in taken:
                taken.add(name)
                return name

    def _stop_worker(self, action: StopWorker, observed: Observed) -> None:
        if action.departure and action.member and action.round is not None:
            self.run.announce_departure(observed.state, action.member, action.departure.value, action.round)
        self.workers.stop(action.name)

    def _handle_exit(self, action: HandleExit, observed: Observed) -> None:
        """End the worker's round (charging per its classification) unless that round already ended."""
        state = self.run.read()
        current = state.round
        if action.round is not None and current is not None and current.sealed and current.number == action.round:
            self.run.end_round(state, current, action.incident)
        elif action.incident.action is Action.FAIL_JOB:
            self.run.close(state, permanent_failure(action.incident, time.time()))

    def _close(self, action: CloseJob, observed: Observed) -> None:
        self.run.close(observed.state, Closed(action.reason.value, action.message, time.time()))

