"""Starting workers: what the OS refuses is a failure of that job (never the controller's exception), the
machine's process cap is checked before anything starts, and each run gets a checkpoint directory of its own.

Real etcd, the real JobController and LocalProcesses; the processes are real (no agent needed to show
what a worker's environment holds).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from elastic.cluster.base import WorkerLaunch
from elastic.cluster.processes import pids_with_env
from elastic.controller.loop import JobController
from elastic.controller.manager import local_workers
from elastic.controller.submit import submit_job
from elastic.policy.incident import JobEnd
from elastic.spec import ElasticJob, parse_job
from elastic.store import JobKeys, Store
from elastic.store.server import EtcdServer

TOO_MANY_PROCESSES, WORKER_START_FAILED = JobEnd.TOO_MANY_PROCESSES, JobEnd.WORKER_START_FAILED


def job(name: str, **spec: Any) -> ElasticJob:
    return parse_job({
        "apiVersion": "elastic.dev/v1alpha1", "kind": "ElasticJob", "metadata": {"name": name},
        "spec": {"maxReplicas": 2, "worker": {"command": ["python", "-c", "pass"]}, **spec},
    })  # fmt: skip


def wait_until(condition: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.05)
    return condition()


@pytest.fixture
def store(etcd_server: EtcdServer) -> Iterator[Store]:
    with Store(etcd_server.client_url, retry_seconds=5) as client:
        yield client
        client.delete_prefix("/elastic/jobs/default/")


def controller(store: Store, submitted: ElasticJob, log_dir: Path, process_cap: int | None = 8) -> JobController:
    workers = local_workers(store, submitted, log_dir)
    return JobController(store, submitted, workers, store.endpoints_text, process_cap)


def run_until_final(ctl: JobController, timeout: float = 20) -> dict[str, Any]:
    """Step the controller (as its loop does) until the job is final and nothing of it runs."""
    deadline = time.monotonic() + timeout
    status = ctl.step()
    while not ctl.done() and time.monotonic() < deadline:
        time.sleep(0.05)
        status = ctl.step()
    assert ctl.done(), status
    return status


def test_a_working_dir_that_does_not_exist_fails_the_job_with_the_os_error(store: Store, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    submitted = submit_job(store, job("bad-cwd", worker={"command": ["python", "-c", "pass"],
                                                         "workingDir": str(missing)}))  # fmt: skip
    status = run_until_final(controller(store, submitted, tmp_path / "logs"))
    assert (status["phase"], status["reason"]) == ("Failed", WORKER_START_FAILED), status
    assert "No such file or directory" in status["message"] and str(missing) in status["message"], status
    assert "spec.worker.workingDir" in status["message"], status
    assert not pids_with_env("ELASTIC_WORKER=bad-cwd-"), "no worker of the job may be left running"


def test_more_processes_than_the_machine_cap_fail_the_job_before_any_starts(store: Store, tmp_path: Path) -> None:
    # replicas unset and minReplicas 10^9: it can never run here (one that fits smaller runs at what fits)
    submitted = submit_job(store, job("huge", minReplicas=1_000_000_000, maxReplicas=1_000_000_000))
    ctl = controller(store, submitted, tmp_path / "logs", process_cap=8)
    started = time.monotonic()
    status = run_until_final(ctl)
    assert time.monotonic() - started < 5
    assert (status["phase"], status["reason"]) == ("Failed", TOO_MANY_PROCESSES), status
    assert "1000000000 training processes, more than the 8" in status["message"], status
    assert "spec.minReplicas" in status["message"], status
    assert ctl.workers.observe() == [] and not (tmp_path / "logs").exists(), "not a single worker was started"


def test_nproc_per_node_counts_towards_the_cap(store: Store, tmp_path: Path) -> None:
    submitted = submit_job(store, job("wide", minReplicas=2, maxReplicas=2, nprocPerNode=5))
    status = run_until_final(controller(store, submitted, tmp_path / "logs", process_cap=8))
    assert status["reason"] == TOO_MANY_PROCESSES and "2 worker(s) x nprocPerNode 5 = 10" in status["message"]


def checkpoint_dir_of_a_worker(store: Store, submitted: ElasticJob, log_dir: Path) -> str:
    """Start one local worker of this run that prints the checkpoint directory it was given."""
    workers = local_workers(store, submitted, log_dir)
    name = f"{submitted.metadata.name}-0001"
    program = "import os; print(os.environ['ELASTIC_CHECKPOINT_DIR'])"
    workers.start(WorkerLaunch(name, [sys.executable, "-c", program], {}))
    assert wait_until(lambda: not workers.observe()[0].alive, 20)
    workers.forget(name)
    return (log_dir / f"{name}.log").read_text().splitlines()[-1]  # the log is appended to


def test_a_job_submitted_again_under_its_name_gets_a_fresh_checkpoint_directory(store: Store, tmp_path: Path) -> None:
    keys = JobKeys("default", "again")
    first = submit_job(store, job("again"))
    first_dir = checkpoint_dir_of_a_worker(store, first, tmp_path)
    store.put_json(keys.status, {"phase": "Succeeded"})  # the first run is over: the name may be reused
    second = submit_job(store, job("again"))
    second_dir = checkpoint_dir_of_a_worker(store, second, tmp_path)

    assert first.metadata.uid != second.metadata.uid
    assert first_dir != second_dir, "a new run must never resume from the old run's checkpoint"
    for run, directory in ((first, first_dir), (second, second_dir)):
        assert Path(directory).parent == tmp_path / "checkpoints" and run.metadata.uid in directory
    # The same run (a controller restarted mid-job) keeps its directory: it resumes its own checkpoints.
    assert checkpoint_dir_of_a_worker(store, second, tmp_path) == second_dir
