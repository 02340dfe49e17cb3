"""Stories of `elastic run` and `elastic controller`: real etcd, real worker processes, gloo on CPU."""

from __future__ import annotations

import itertools
import os
import signal
import time

import pytest
from cli_harness import job_yaml, processes_of

from harness.agents import wait_until

pytestmark = pytest.mark.slow

STARTUP = 90


def test_one_injected_crash_costs_one_restart_and_the_job_succeeds(cli, tmp_path) -> None:
    job = job_yaml("crash-once", ["--steps", "40", "--crash-at-step", "17", "--crash-exit-code", "137",
                                  "--crash-once-marker", "crashed"])
    logs = tmp_path / "logs"
    run = cli.start("run", str(cli.write(job)), "--log-dir", str(logs))
    assert run.wait(timeout=STARTUP + 120) == 0, cli.output(run)
    status = cli.status("crash-once")
    assert status["phase"] == "Succeeded" and status["restarts"]["used"] == 1, status
    assert status["lastFailure"]["exitCode"] == 137
    steps = [s.step for s in cli.steps(logs)]
    assert steps[-1] == 40
    for before, after in itertools.pairwise(steps):
        assert after >= before - 5, f"steps went back past the last checkpoint: {before} -> {after}"
    # the Restarting phase may be too short for a status line; the charge shows in every line after it
    assert "restarts 1/3" in cli.output(run) and "Succeeded" in cli.output(run)
    assert not processes_of("crash-once"), "nothing may be left running"


def test_fail_job_rule_fails_fast_naming_rule_and_worker(cli, tmp_path) -> None:
    job = job_yaml("exit-three", ["--steps", "200", "--crash-at-step", "6", "--crash-exit-code", "3"],
                   failurePolicy={"maxRestarts": 5, "rules": [
                       {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}]})
    run = cli.start("run", str(cli.write(job)), "--log-dir", str(tmp_path / "logs"))
    assert wait_until(lambda: cli.status("exit-three").get("phase") == "Running", STARTUP), cli.output(run)
    assert run.wait(timeout=60) == 1, cli.output(run)
    status = cli.status("exit-three")
    assert (status["phase"], status["reason"]) == ("Failed", "FailJobRule"), status
    assert "exit code 3" in status["message"] and "rules[0]" in status["message"] and "worker" in status["message"]
    assert status["restarts"]["used"] == 0
    assert "FailJobRule" in cli.output(run)
    assert not processes_of("exit-three")


def test_spent_budget_fails_with_backoff_limit_and_lists_both_incidents(cli, tmp_path) -> None:
    job = job_yaml("budget-one", ["--steps", "200", "--crash-at-step", "8", "--crash-exit-code", "137"],
                   failurePolicy={"maxRestarts": 1})
    run = cli.start("run", str(cli.write(job)), "--log-dir", str(tmp_path / "logs"))
    assert run.wait(timeout=STARTUP + 90) == 1, cli.output(run)
    status = cli.status("budget-one")
    assert (status["phase"], status["reason"]) == ("Failed", "BackoffLimitExceeded"), status
    charges = cli.budget("budget-one")["charges"]
    assert len(charges) == 2 and {c["exit_code"] for c in charges} == {137}, charges
    assert not processes_of("budget-one")


def test_scaling_up_and_down_is_free(cli, tmp_path) -> None:
    job = job_yaml("scaled", ["--steps", "100000"])
    run = cli.start("run", str(cli.write(job)), "--log-dir", str(tmp_path / "logs"))
    assert wait_until(lambda: cli.status("scaled").get("worldSize") == 2, STARTUP), cli.output(run)
    assert cli.run("scale", "default/scaled", "3").returncode == 0
    assert wait_until(lambda: cli.status("scaled").get("worldSize") == 3, STARTUP), cli.output(run)
    assert cli.status("scaled")["restarts"]["used"] == 0
    assert cli.run("scale", "scaled", "2").returncode == 0
    assert wait_until(
        lambda: cli.status("scaled").get("worldSize") == 2 and cli.status("scaled").get("phase") == "Running", STARTUP
    ), cli.output(run)
    assert cli.status("scaled")["restarts"]["used"] == 0, cli.budget("scaled")
    assert cli.run("delete", "scaled").returncode == 0
    assert run.wait(timeout=60) == 1
    assert cli.status("scaled")["reason"] == "Deleted"
    assert wait_until(lambda: not processes_of("scaled"), 30)


def test_rank0_success_policy_stops_the_stragglers(cli, tmp_path) -> None:
    job = job_yaml("chief", ["--steps", "20", "--linger-seconds", "300"], successPolicy="Rank0")
    started = time.monotonic()
    run = cli.start("run", str(cli.write(job)), "--log-dir", str(tmp_path / "logs"))
    assert run.wait(timeout=STARTUP + 60) == 0, cli.output(run)
    assert time.monotonic() - started < 300, "success must not wait for the lingering ranks"
    status = cli.status("chief")
    assert status["phase"] == "Succeeded" and "Rank0" in status["message"]
    assert not processes_of("chief"), "the other workers are stopped"


def test_a_killed_controller_is_replaced_without_double_charges_or_orphans(cli, tmp_path) -> None:
    job = job_yaml("survivor", ["--steps", "150", "--step-seconds", "0.1"])
    logs = tmp_path / "logs"
    first = cli.start("run", str(cli.write(job)), "--log-dir", str(logs))
    assert wait_until(lambda: cli.status("survivor").get("progress", {}).get("step", 0) >= 10, STARTUP), (
        cli.output(first)
    )
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    workers_before = processes_of("survivor")
    assert workers_before, "the workers outlive their controller"
    assert cli.run("chaos", "kill", "survivor", "--training").returncode == 0  # an incident while it is down
    second = cli.start("controller", "--log-dir", str(logs))
    assert wait_until(lambda: cli.status("survivor").get("phase") == "Succeeded", STARTUP + 120), cli.output(second)
    assert cli.budget("survivor")["used"] == 1, cli.budget("survivor")
    assert wait_until(lambda: not processes_of("survivor"), 30), "no orphan after the job ended"
