"""Local controllers: `elastic controller` (every submitted job) and `elastic run`'s (its one job).

Only the elected leader acts (machinery/etcd_election.py): each step starts with an election step, and every write of a
step goes through the leader's fenced store. A controller that stands by, or is deposed mid-step, drops
its JobControllers and leaves the workers running: they are the job's, not this process's, and the
leader adopts them through their records in etcd.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elastic.cluster.external import ExternalAgents
from elastic.cluster.local import LocalProcesses
from elastic.codec import CorruptValueError, decode_spec, status_for_display
from elastic.controller.loop import JobController, run_id_of
from elastic.controller.machinery.etcd_election import Election
from elastic.controller.machinery.job_events import DECIDING_KEYS, JobEvents, queue_when_due
from elastic.controller.machinery.workqueue import WorkQueue
from elastic.controller.metrics_export import ControllerMetrics
from elastic.controller.status import FINAL_PHASES
from elastic.controller.submit import list_jobs
from elastic.errors import NotLeaderError, StoreUnreachableError
from elastic.rendezvous.run import JobRun
from elastic.rendezvous.state import Closed
from elastic.spec import ElasticJob
from elastic.spec.names import job_name_for
from elastic.store import JobKeys, Store
from elastic.store.fenced import FencedStore
from elastic.store.outage import Outage

log = logging.getLogger(__name__)

LOCAL_PROCESS_SECONDS = 0.3  # a job of local processes is stepped this often: their exits are not etcd events
ELECTION_SECONDS = 1.0  # the longest a pass waits for a queued job: the election is stepped at least this often


def local_workers(store: Store, job: ElasticJob, log_dir: Path) -> LocalProcesses:
    """The job's local processes, logging to `log_dir`, with a checkpoint directory of this run's own.

    The directory is named after the run id (a fresh uid per submission), not the job's name: a job
    submitted again under the same name starts from scratch and never resumes the old run's checkpoint.
    """
    keys = JobKeys(job.metadata.namespace, job.metadata.name)
    return LocalProcesses(store, keys, log_dir, log_dir / "checkpoints" / job_name_for(run_id_of(job)))


class LocalControllerManager:
    def __init__(
        self,
        store: Store,
        endpoints: str,
        log_root: Path,
        election: Election | None = None,
        process_cap: int | None = None,
        metrics: ControllerMetrics | None = None,
        external_workers: bool = False,
        period: float = LOCAL_PROCESS_SECONDS,
    ) -> None:
        """`external_workers`: the platform runs every job's agents (compose, `--backend external`): jobs are
        decided and reported here, no process is started. `period`: how often a job with local processes is
        looked at (their exits)."""
        self.store = store
        self.endpoints = endpoints
        self.log_root = log_root
        self.external_workers = external_workers
        self.election = election or Election(store)
        self.process_cap = process_cap
        self.metrics = metrics  # one for the process: what it counted outlives a change of leader
        self.controllers: dict[str, JobController] = {}
        self._acting_as: FencedStore | None = None
        self.queue = WorkQueue()
        self.period = period

    def controller_for(self, job: ElasticJob, store: Store) -> JobController:
        if self.external_workers:
            agents = ExternalAgents(store, JobKeys(job.metadata.namespace, job.metadata.name))
            return JobController(store, job, agents, self.endpoints, metrics=self.metrics, external_workers=True)
        workers = local_workers(store, job, self.log_root / job.metadata.namespace / job.metadata.name)
        return JobController(store, job, workers, self.endpoints, self.process_cap, metrics=self.metrics,
                             processes_elsewhere=lambda: self.processes_besides(job.key))

    def processes_besides(self, key: str) -> int:
        """Training processes the other jobs of this controller run: the process cap is the machine's."""
        return sum(c.processes_in_use for k, c in self.controllers.items() if k != key)

    def step(self, on_status: Callable[[str, dict], None] | None = None, wait: float = 0.0) -> bool:
        """One election step, then, while leading, every job queued now (waiting up to `wait` for one). True
        when this controller acted. A new term queues every job once; after that a job whose agents the
        platform runs (`external_workers`) is queued by its keys in etcd (`JobEvents`, started by
        `run_forever`) and by a deadline of its own falling due, never on a timer; a job of local processes
        is also stepped every `period` (a process's exit shows in etcd only once its lease lapses)."""
        fenced = self.election.lead()
        if fenced is not self._acting_as:  # a new term (or none): controllers of an old one must not act
            self.controllers.clear()
            self._acting_as = fenced
            if fenced is not None:
                self._queue_every_job(fenced)
        if fenced is None:
            time.sleep(min(wait, LOCAL_PROCESS_SECONDS))  # standing by: try for leadership again soon
            return False
        try:
            key = self.queue.get(wait)
            while key is not None:
                try:
                    self._step_job(fenced, key, on_status)  # type: ignore[arg-type]
                finally:
                    self.queue.done(key)
                key = self.queue.get(0)
        except NotLeaderError as err:
            log.warning("%s", err)
            self.controllers.clear()
            return False
        return True

    def run_forever(self, on_status: Callable[[str, dict], None] | None = None) -> None:
        """Act while leading, stand by otherwise; on the way out, hand leadership over at once. etcd away is a
        wait, said once (`Outage`), never an exit."""
        events = self.watch_jobs()
        outage = Outage("the controller")
        try:
            while True:
                outage.call(lambda: self.step(on_status, wait=ELECTION_SECONDS))
        finally:
            events.close()
            self.election.resign()

    def watch_jobs(self) -> JobEvents:
        """Start following every job's keys: a change that decides something queues its job."""
        return JobEvents(self.store, self.queue, on_lost=self._queue_known,
                         deciding=DECIDING_KEYS | {"spec"}).start()  # `elastic submit`, `elastic scale`

    def _queue_every_job(self, store: Store) -> None:
        for job in list_jobs(store):
            self.queue.add((job.metadata.namespace, job.metadata.name))

    def _queue_known(self) -> None:
        for key in list(self.controllers):
            self.queue.add(tuple(key.split("/", 1)))

    def _step_job(self, store: FencedStore, key: tuple[str, str], on_status: Callable[[str, dict], None] | None,
                  ) -> None:
        job_key = "/".join(key)
        controller = self.controllers.get(job_key)
        if controller is None:
            keys = JobKeys(*key)
            entry = store.get(keys.spec)
            if entry is None:
                return  # not submitted (yet), or deleted
            try:
                job = decode_spec(entry.key, entry.value)
            except CorruptValueError as err:  # logged and skipped, as `list_jobs` does: never fatal to the rest
                log.warning("%s", err)
                return
            status_entry = store.get(keys.status)
            status = status_for_display(keys.status, status_entry.value if status_entry else None)
            if status.get("phase") in FINAL_PHASES and not store.get_prefix(keys.workers_prefix)[0]:
                return
            controller = self.controllers[job_key] = self.controller_for(job, store)
        status = controller.step()
        if on_status is not None:
            on_status(job_key, status)
        if controller.done():
            controller.finish()
            del self.controllers[job_key]
        elif not self.external_workers:
            # Local processes: their exits, and room freed by another job's, are seen by looking (every period).
            self.queue.add_after(key, self.period)
        else:
            queue_when_due(self.queue, key, controller.due_in)


class LocalJobRunner:
    """`elastic run`'s controller: acts for its one job while this process leads, follows it otherwise.

    When another controller leads the etcd, that one runs the job's workers; this one reports the job's
    status until it is final, and takes over (adopting the workers) if the leader goes away.
    """

    def __init__(
        self,
        store: Store,
        job: ElasticJob,
        endpoints: str,
        log_dir: Path,
        election: Election,
        process_cap: int | None = None,
        metrics: ControllerMetrics | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        """`say`: where an etcd outage's two lines go (default: the log)."""
        self.store = store
        self.job = job
        self.endpoints = endpoints
        self.log_dir = log_dir
        self.election = election
        self.process_cap = process_cap
        self.metrics = metrics
        self.keys = JobKeys(job.metadata.namespace, job.metadata.name)
        self.controller: JobController | None = None
        self.workers: LocalProcesses | None = None
        self._acting_as: FencedStore | None = None
        self.outage = Outage("elastic run", say=say)

    def step(self) -> dict[str, Any]:
        fenced = self.election.lead()
        if fenced is not self._acting_as:
            self.controller, self.workers, self._acting_as = None, None, fenced
        if fenced is None:
            return self._shown_status()
        if self.controller is None:
            self.workers = local_workers(fenced, self.job, self.log_dir)
            self.controller = JobController(
                fenced, self.job, self.workers, self.endpoints, self.process_cap, metrics=self.metrics
            )
        try:
            return self.controller.step()
        except NotLeaderError as err:
            log.warning("%s", err)
            self.controller, self.workers = None, None
            return self._shown_status()

    def _shown_status(self) -> dict[str, Any]:
        entry = self.store.get(self.keys.status)
        return status_for_display(self.keys.status, entry.value if entry else None)

    def done(self, status: dict[str, Any]) -> bool:
        if self.controller is not None:
            return self.controller.done()
        return status.get("phase") in FINAL_PHASES  # the leader winds the workers down

    def run_until_done(self, on_status: Callable[[dict[str, Any]], None] | None = None, period: float = 0.3) -> dict:
        """Step until the job is done. etcd away is a wait, said once (`Outage`): the workers run on, and what
        happened meanwhile is decided when etcd answers again (a step is level-triggered, so one cut short
        by the outage is simply taken again)."""
        while True:
            status, done = self.outage.call(lambda: self._step_and_finish(on_status))
            if done:
                return status
            time.sleep(period)

    def _step_and_finish(self, on_status: Callable[[dict[str, Any]], None] | None) -> tuple[dict[str, Any], bool]:
        """One step, shown; when it leaves the job done, finish it (stop what runs, final status)."""
        status = self.step()
        if on_status is not None and status:
            on_status(status)
        done = self.done(status)
        if done:
            try:
                if self.controller is not None:
                    self.controller.finish()
            except NotLeaderError as err:  # deposed at the very end: the new leader finishes
                log.warning("%s", err)
        return status, done

    def wind_down(self, closed: Closed) -> dict[str, Any]:
        """Close the job (unless it is closed already) and, while this process leads, stop its workers and
        write its final status: an interrupted `elastic run` leaves its job Failed (its status says why),
        never Running with nobody to finish it. Under another leader, that one winds it down."""
        with contextlib.suppress(StoreUnreachableError, NotLeaderError):
            self.step()  # leadership as it stands now: an etcd outage may have lapsed the term this process had
        controller = self.controller
        run = JobRun(controller.store if controller is not None else self.store, self.keys)
        try:
            run.close(run.read(), closed)
        except NotLeaderError as err:  # another controller leads: it winds the job down
            log.warning("%s", err)
            return self._shown_status()
        if controller is None:
            return self._shown_status()
        self.stop_workers()
        try:
            status = controller.step()
            if controller.done():
                controller.finish()
        except NotLeaderError as err:  # deposed meanwhile: the new leader finishes the job
            log.warning("%s", err)
            return self._shown_status()
        return status

    def stop_workers(self) -> None:
        """Stop the workers this process runs for the job (none while another controller leads)."""
        if self.workers is not None:
            self.workers.stop_all()
