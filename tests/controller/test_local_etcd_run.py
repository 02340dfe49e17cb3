"""`elastic run` with no `--etcd`: the local etcd it starts outlives the run, the next run reuses it, and
`status`, `describe` and `logs` read the finished job from it with no flag. Each way a run can end (success,
failure, Ctrl-C, SIGTERM, a closed stdout) leaves no worker and no etcd but the recorded one, which
`elastic etcd stop` ends. Real etcd, real torchrun agents, a state directory of this module's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cli_harness import REPO, job_yaml, processes_of

from elastic.cli import local_etcd
from elastic.cluster.processes import is_running
from elastic.store import JobKeys, Store
from harness.agents import wait_until

pytestmark = pytest.mark.slow

STARTUP = 90


@pytest.fixture(scope="module")
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """This module's state directory; at its end `elastic etcd stop` must leave no etcd on its data."""
    home = tmp_path_factory.mktemp("state")
    yield home
    stopped = elastic(home, "etcd", "stop")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stdout + stopped.stderr
    assert wait_until(lambda: not etcds_on(home), 10), f"an etcd is left on {home}: {etcds_on(home)}"


@pytest.fixture
def state(state_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(local_etcd.STATE_ENV, str(state_home))
    monkeypatch.delenv("ELASTIC_ETCD", raising=False)
    return state_home


def environment(home: Path) -> dict[str, str]:
    env = {**os.environ, local_etcd.STATE_ENV: str(home), "OMP_NUM_THREADS": "1"}
    env.pop("ELASTIC_ETCD", None)
    return env


def elastic(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "elastic.cli.main", *args], cwd=REPO, env=environment(home),
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def start_run(home: Path, job: dict, tmp_path: Path) -> subprocess.Popen[str]:
    path = tmp_path / f"{job['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(job))
    return subprocess.Popen(
        [sys.executable, "-m", "elastic.cli.main", "run", str(path), "--log-dir", str(tmp_path / "logs")],
        cwd=REPO, env=environment(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def one_worker(name: str, *script_args: str, **spec: object) -> dict:
    job = job_yaml(name, list(script_args), **spec)
    job["spec"].update(minReplicas=1, maxReplicas=1, replicas=1)
    return job


def etcds_on(home: Path) -> list[int]:
    """Running etcd servers whose data lies under `home`."""
    needle = f"--data-dir={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(part.startswith(needle) for part in command) and is_running(int(entry.name)):
                found.append(int(entry.name))
    return found


def assert_nothing_left_but_the_local_etcd(home: Path, name: str) -> None:
    recorded = local_etcd.running()
    assert recorded is not None, "the local etcd runs on after the run"
    assert wait_until(lambda: not processes_of(name), 30), f"workers of {name} left: {processes_of(name)}"
    assert etcds_on(home) == [recorded.pid], "one etcd: the recorded one"


def status_of(name: str) -> dict:
    recorded = local_etcd.running()
    assert recorded is not None
    with Store(recorded.url) as store:
        return store.get_json(JobKeys("default", name).status) or {}


def wait_running(run: subprocess.Popen[str], name: str) -> None:
    def running() -> bool:
        if run.poll() is not None:
            return True
        return local_etcd.running() is not None and status_of(name).get("phase") == "Running"

    assert wait_until(running, STARTUP) and run.poll() is None, run.communicate(timeout=60)


def test_a_finished_run_can_be_inspected_with_no_flag_from_the_etcd_it_leaves(state, tmp_path) -> None:
    fresh = local_etcd.running() is None
    run = start_run(state, one_worker("ends", "--steps", "5"), tmp_path)
    out, err = run.communicate(timeout=STARTUP + 60)
    assert run.returncode == 0, out + err
    first = out.splitlines()[0]
    if fresh:
        assert " started at http://127.0.0.1:" in first and "'elastic etcd stop'" in first, first
        assert str(state / "elastic" / "etcd") in first, first
    else:
        assert first.startswith("using the local etcd at http://127.0.0.1:"), first
    assert_nothing_left_but_the_local_etcd(state, "ends")
    for verb in ("status", "describe", "logs"):
        shown = elastic(state, verb, "ends")
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, (verb, shown.stdout, shown.stderr)
    assert "Succeeded" in elastic(state, "status", "ends").stdout
    assert "Name:          ends" in elastic(state, "describe", "ends").stdout
    status = elastic(state, "etcd", "status")
    assert status.returncode == 0 and f"pid {local_etcd.running().pid}" in status.stdout, status.stdout


def test_the_next_run_reuses_the_local_etcd_and_a_failure_leaves_nothing_behind(state, tmp_path) -> None:
    before = local_etcd.running() or local_etcd.start()[0]
    job = one_worker("fails", "--crash-at-step", "2", "--crash-exit-code", "3", failurePolicy={"maxRestarts": 0})
    run = start_run(state, job, tmp_path)
    out, err = run.communicate(timeout=STARTUP + 60)
    assert run.returncode == 1, out + err
    assert out.splitlines()[0] == f"using the local etcd at {before.url} (data: {before.data_dir})", out
    assert "Traceback (most recent call last)" not in err.split("worker ")[0], err
    assert_nothing_left_but_the_local_etcd(state, "fails")
    assert local_etcd.running() == before
    assert "Failed" in elastic(state, "status", "fails").stdout


@pytest.mark.parametrize(("how", "exit_code", "said"), [
    (signal.SIGINT, 130, "Ctrl-C"),
    (signal.SIGTERM, 130, "SIGTERM"),
    ("closed stdout", 128 + signal.SIGPIPE, "stdout closed"),
], ids=["Ctrl-C", "SIGTERM", "closed stdout"])  # fmt: skip
def test_a_stopped_run_finishes_its_job_and_leaves_only_the_local_etcd(how, exit_code, said, state,
                                                                        tmp_path) -> None:
    name = f"stopped-{exit_code}-{said.split()[0].lower().replace('-', '')}"
    run = start_run(state, one_worker(name, "--steps", "100000"), tmp_path)
    assert run.stdout is not None
    if how == "closed stdout":  # elastic run JOB.yaml | head -2
        lines = [run.stdout.readline(), run.stdout.readline()]
        assert all(lines), lines
        wait_running(run, name)
        run.stdout.close()  # its next line (the job's progress) meets the closed pipe
    else:
        wait_running(run, name)
        run.send_signal(how)
    assert run.wait(timeout=90) == exit_code
    err = run.stderr.read() if run.stderr else ""
    assert "Traceback" not in err and f"interrupted ({said})" in err, err
    status = status_of(name)
    assert (status["phase"], status["reason"]) == ("Failed", "Interrupted"), status
    assert said in status["message"], status
    assert_nothing_left_but_the_local_etcd(state, name)
