"""Workers as local processes: each one is an `elastic agent` (torchrun) with its own log file.

Records live in etcd (`workers/<name>`: pid, log, start time), so that a controller that was killed and
restarted adopts the processes it finds alive instead of orphaning them or starting duplicates. A process
this controller started is its child and reports its exit code. An adopted one is nobody's child here, so
its agent records its own exit code in etcd as it exits (`exits/<name>`, see `exit_recorded`): the job's
exit-code rules apply to it too. Only an agent killed outright (SIGKILL, a lost node) leaves no record;
its exit code is then unknown (None).

A worker that cannot be started (the OS refuses: a workingDir that does not exist, no more processes)
raises WorkerStartError with the OS error, which the controller turns into a failure of that job.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from elastic.cluster.base import WorkerLaunch, WorkerObservation, WorkerStartError
from elastic.cluster.processes import agent_of_worker, descendants_of, is_worker
from elastic.codec import CorruptValueError, WorkerExitRecord, WorkerRecord, decode_model
from elastic.errors import ElasticError
from elastic.spec.model import CHECKPOINT_DIR_ENV
from elastic.store import Delete, EtcdAuth, GatewayStore, JobKeys, Put, StoreBase

log = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 15.0

# Set in each agent's environment: where it records its exit code (and ELASTIC_ETCD_ENDPOINTS: in which etcd).
EXIT_KEY_ENV = "ELASTIC_WORKER_EXIT_KEY"
ENDPOINTS_ENV = "ELASTIC_ETCD_ENDPOINTS"

# At most this many training processes (workers x nprocPerNode) run on this machine; more would only make
# it thrash, and a typo such as `maxReplicas: 1000000000` must not fork until the machine falls over.
MAX_PROCESSES_ENV = "ELASTIC_MAX_LOCAL_PROCESSES"
PROCESSES_PER_CPU = 4


def default_max_processes() -> int:
    """4 x the CPUs this process may run on (its affinity: a container's or taskset's share, not the host's)."""
    return PROCESSES_PER_CPU * len(os.sched_getaffinity(0))


def worker_environment(
    launch: WorkerLaunch, checkpoint_dir: Path, exit_key: str, inherited: Mapping[str, str]
) -> dict[str, str]:
    """A local worker's whole environment: the controller's own (`inherited`), the job's, then what the
    controller sets for every worker. The checkpoint directory is per run unless the job (or the
    controller's environment) sets one: a new run never resumes from an old run's checkpoint by accident."""
    return {
        CHECKPOINT_DIR_ENV: str(checkpoint_dir),
        **inherited,
        **launch.env,
        "ELASTIC_WORKER": launch.name,
        EXIT_KEY_ENV: exit_key,
        "PYTHONUNBUFFERED": "1",
    }


def start_failure(launch: WorkerLaunch, error: OSError) -> str:
    """What the job's status says when the OS refused to start a worker, naming the spec field if it was one."""
    field = " (spec.worker.workingDir)" if launch.working_dir and error.filename == launch.working_dir else ""
    where = f": {error.filename}" if error.filename else ""
    return f"worker {launch.name} could not be started: {error.strerror or error}{where}{field}"


@dataclass
class _Worker:
    name: str
    pid: int
    started_at: float
    log_path: str
    process: subprocess.Popen[bytes] | None = None  # None when adopted from an earlier controller
    exit_code: int | None = None
    gone: bool = False
    stop_requested_at: float | None = None
    descendants: tuple[int, ...] = ()


class LocalProcesses:
    def __init__(self, store: StoreBase, keys: JobKeys, log_dir: Path, checkpoint_dir: Path) -> None:
        self.store = store
        self.keys = keys
        self.log_dir = log_dir
        self.checkpoint_dir = checkpoint_dir
        self._workers: dict[str, _Worker] = {}
        self._adopt()

    def _adopt(self) -> None:
        entries, _ = self.store.get_prefix(self.keys.workers_prefix)
        for entry in entries:
            name = entry.key[len(self.keys.workers_prefix) :]
            try:
                record = decode_model(WorkerRecord, entry.key, entry.value)
                worker = _Worker(name, record.pid, record.started_at, record.log)
            except CorruptValueError as err:
                # The record does not decode, but its process may run: find it by its environment, or a
                # second worker would be started beside it (issue 22). Not found: nothing runs, it is gone.
                pid = agent_of_worker(name)
                log.warning("worker %s: %s; %s", name, err, f"adopting pid {pid} found by its environment"
                            if pid else "no process of it runs")
                if pid is None:
                    continue
                worker = _Worker(name, pid, time.time(), str(self.log_dir / f"{name}.log"))
            self._workers[name] = worker
            self._refresh(worker)
            log.info("adopted worker %s (pid %d, %s)", name, worker.pid, "gone" if worker.gone else "alive")

    def start(self, launch: WorkerLaunch) -> None:
        log_path = self.log_dir / f"{launch.name}.log"
        env = worker_environment(launch, self.checkpoint_dir, self.keys.worker_exit(launch.name), os.environ)
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with log_path.open("ab") as out:
                process = subprocess.Popen(
                    launch.command,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=launch.working_dir,
                    start_new_session=True,  # a Ctrl-C meant for the controller must not kill training
                )
        except OSError as err:
            raise WorkerStartError(start_failure(launch, err)) from None
        worker = _Worker(launch.name, process.pid, time.time(), str(log_path), process)
        try:
            # The log's record outlives the worker's: `elastic logs` and a failed job's root cause need it after.
            record = {"pid": process.pid, "started_at": worker.started_at, "log": str(log_path)}
            self.store.txn([], [Put.json(self.keys.worker(launch.name), record),
                                Put.json(self.keys.log(launch.name), {"path": str(log_path),
                                                                      "started_at": worker.started_at})])
        except BaseException:
            # No record, no worker: a process nobody can adopt would train on as a duplicate (a fenced
            # store refuses this write once this controller is deposed).
            process.kill()
            process.wait()
            raise
        self._workers[launch.name] = worker

    def observe(self) -> list[WorkerObservation]:
        result = []
        for worker in self._workers.values():
            self._refresh(worker)
            alive = not worker.gone
            if alive and worker.stop_requested_at and time.time() - worker.stop_requested_at > STOP_GRACE_SECONDS:
                self._kill(worker)
            result.append(
                WorkerObservation(
                    worker.name,
                    alive,
                    worker.exit_code,
                    None,
                    worker.started_at,
                    worker.stop_requested_at is not None,
                )
            )
        return result

    def _refresh(self, worker: _Worker) -> None:
        if worker.gone:
            return
        worker.descendants = tuple(sorted(set(worker.descendants) | set(descendants_of(worker.pid))))
        if worker.process is not None:
            code = worker.process.poll()
            if code is not None:
                worker.exit_code, worker.gone = code, True
        elif not is_worker(worker.pid, worker.name):
            worker.gone = True
            worker.exit_code = self._recorded_exit(worker)
        if worker.gone:
            _kill_all(worker.descendants)  # a dead agent's training processes must not train on as orphans

    def _recorded_exit(self, worker: _Worker) -> int | None:
        """The exit code an adopted worker's agent recorded, if it was that process (pid) that recorded it."""
        entry = self.store.get(self.keys.worker_exit(worker.name))
        try:
            record = decode_model(WorkerExitRecord, entry.key, entry.value) if entry else None
        except CorruptValueError as err:
            log.warning("%s", err)
            record = None
        if record is None or record.pid != worker.pid:
            return None
        return record.exit_code

    def stop(self, name: str) -> None:
        """Ask the agent to stop (SIGTERM: torch's agent stops its workers); SIGKILL after a grace period."""
        worker = self._workers.get(name)
        if worker is None or worker.gone or worker.stop_requested_at is not None:
            return
        worker.stop_requested_at = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGTERM)

    def _kill(self, worker: _Worker) -> None:
        self._refresh(worker)
        _kill_all((*worker.descendants, worker.pid))
        if worker.process is not None:
            worker.process.wait()
        self._refresh(worker)
        worker.gone = True

    def forget(self, name: str) -> None:
        self._workers.pop(name, None)
        self.store.txn([], [Delete(self.keys.worker(name)), Delete(self.keys.worker_exit(name))])

    def stop_all(self, timeout: float = STOP_GRACE_SECONDS) -> None:
        """Stop every worker and wait until none is left (no orphan training processes)."""
        for name in list(self._workers):
            self.stop(name)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(not w.gone for w in self._workers.values()):
            for worker in self._workers.values():
                self._refresh(worker)
            time.sleep(0.1)
        for worker in self._workers.values():
            if not worker.gone:
                self._kill(worker)
            _kill_all(worker.descendants)

    def log_of(self, name: str) -> Path | None:
        worker = self._workers.get(name)
        return Path(worker.log_path) if worker and worker.log_path else None

    def pids(self) -> dict[str, int]:
        return {w.name: w.pid for w in self._workers.values() if not w.gone}

    def close(self) -> None:
        pass


def _kill_all(pids: tuple[int, ...] | list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def exit_status(error: BaseException | None) -> int:
    """The exit status a parent would see for a Python process ending with `error` (None: it returned)."""
    if error is None:
        return 0
    if isinstance(error, SystemExit):
        code = error.code
        return 0 if code is None else code if isinstance(code, int) else 1
    if isinstance(error, KeyboardInterrupt):
        return -int(signal.SIGINT)  # Python ends itself with SIGINT then
    return 1


def record_own_exit(code: int) -> None:
    """Record this worker process's exit code where its controller looks (best effort, a few seconds)."""
    key, endpoints = os.environ.get(EXIT_KEY_ENV), os.environ.get(ENDPOINTS_ENV)
    if not key or not endpoints:
        return  # not started as a local worker
    try:
        # The same TLS/auth settings and wire as the agent's rendezvous: the controller passed them in the
        # environment; the gateway, because this process may be someone else's that forks.
        with GatewayStore(endpoints, retry_seconds=3, timeout=2, auth=EtcdAuth.from_env()) as store:
            store.put_json(key, {"exit_code": code, "pid": os.getpid(), "at": time.time()})
    except ElasticError as err:
        log.warning("could not record exit code %d at %s: %s", code, key, err)


@contextlib.contextmanager
def exit_recorded() -> Iterator[None]:
    """Run a worker's main so that its exit code is recorded in etcd whichever way it ends."""
    try:
        yield
    except BaseException as err:
        record_own_exit(exit_status(err))
        raise
    record_own_exit(0)
