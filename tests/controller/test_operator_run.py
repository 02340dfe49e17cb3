"""`elastic run` as an operator meets it: stopped with a signal, a typo in the script, a clean success.
Real etcd, real torchrun agents."""

from __future__ import annotations

import signal

import pytest
from cli_harness import job_yaml, processes_of

from harness.agents import wait_until

pytestmark = pytest.mark.slow

STARTUP = 90


def test_a_stopped_run_finishes_its_job_and_the_same_job_runs_again_showing_its_root_cause(cli, tmp_path) -> None:
    job = job_yaml("stopped", ["--steps", "100000"])
    run = cli.start("run", str(cli.write(job)), "--log-dir", str(tmp_path / "logs"))
    assert wait_until(lambda: cli.status("stopped").get("phase") == "Running", STARTUP), cli.output(run)
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=60) == 130, cli.output(run)
    status = cli.status("stopped")
    assert (status["phase"], status["reason"]) == ("Failed", "Interrupted"), status
    assert "SIGTERM" in status["message"] and not processes_of("stopped")

    typo = job_yaml("stopped", [], failurePolicy={"maxRestarts": 1})
    typo["spec"]["worker"]["command"] = ["python", "examples/train_dpp.py"]
    again = cli.run("run", str(cli.write(typo)), "--log-dir", str(tmp_path / "logs2"), timeout=STARTUP + 60)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "already exists" not in again.stderr
    # Python's exit 2 for a script it cannot open is permanent by default: no restart is spent on it.
    assert "FailJobRule" in again.stderr and "the command line cannot run" in again.stderr, again.stderr
    assert "restarts 0/1" in again.stdout, again.stdout
    assert "can't open file" in again.stderr and str(tmp_path / "logs2") in again.stderr, again.stderr
    shown = cli.run("status", "stopped")
    assert "can't open file" in shown.stdout, shown.stdout


def test_a_successful_job_leaves_no_traceback_in_its_agents_logs(cli, tmp_path) -> None:
    logs = tmp_path / "logs"
    run = cli.start("run", str(cli.write(job_yaml("clean", ["--steps", "10"]))), "--log-dir", str(logs))
    assert run.wait(timeout=STARTUP + 60) == 0, cli.output(run)
    texts = {log.name: log.read_text(errors="replace") for log in logs.glob("*.log")}
    assert len(texts) == 2 and all("Traceback" not in text for text in texts.values()), texts
