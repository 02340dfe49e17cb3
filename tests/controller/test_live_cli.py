"""The live view of a real job (real etcd, real torchrun agents): under a pseudo-terminal it is redrawn in
place; to a file (CI logs) or with --no-tty it is plain lines, one per change, with no control code. The
crash is injected only once the watcher is seen following, so its Restarting must be shown."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from cli_harness import ElasticCli, job_yaml, processes_of
from pty_harness import Terminal

from elastic.store import JobKeys
from harness.agents import wait_until

pytestmark = pytest.mark.slow

STARTUP = 90
REDRAW = ("\x1b[1A", "\x1b[2K")  # cursor up, erase line: rich's Live going back over its table
RESTARTING_ROUND_1 = re.compile(r"Restarting +round 1 ")


@pytest.fixture
def terminals() -> Iterator[list[Terminal]]:
    started: list[Terminal] = []
    yield started
    for terminal in started:
        terminal.stop()


def submitted(cli: ElasticCli, name: str) -> bool:
    return cli.store.get(JobKeys("default", name).spec) is not None


def running_at_step(cli: ElasticCli, name: str, step: int) -> bool:
    status = cli.status(name)
    return status.get("phase") == "Running" and status.get("progress", {}).get("step", 0) >= step


def crash_one_training_process(cli: ElasticCli, name: str) -> None:
    killed = cli.run("chaos", "kill", name, "--training", "--signal", "KILL")
    assert killed.returncode == 0, killed.stdout + killed.stderr


def test_elastic_run_on_a_terminal_redraws_and_status_w_to_a_file_prints_plain_lines(cli, tmp_path,
                                                                                     terminals) -> None:
    name = "live-run"
    job = cli.write(job_yaml(name, ["--steps", "60", "--step-seconds", "0.1"]))
    run = Terminal(["run", str(job), "--log-dir", str(tmp_path / "logs"), "--etcd", cli.etcd.client_url])
    terminals.append(run)
    assert wait_until(lambda: submitted(cli, name), STARTUP), run.text()
    watch = cli.start("status", name, "-w")
    assert wait_until(lambda: cli.output(watch).strip() and "events" in run.text(), STARTUP), (
        cli.output(watch), run.text())  # fmt: skip
    assert wait_until(lambda: running_at_step(cli, name, 5), STARTUP), run.text()
    crash_one_training_process(cli, name)

    assert run.wait(timeout=STARTUP + 60) == 0, run.text()
    screen = run.text()
    assert all(code in screen for code in REDRAW), screen
    assert RESTARTING_ROUND_1.search(screen) and "restarts 1/3" in screen and "Succeeded" in screen, screen
    assert "last incident" in screen and "(SIGKILL)" in screen, screen

    assert watch.wait(timeout=60) == 0, cli.output(watch)
    plain = cli.output(watch)
    assert "\x1b" not in plain, plain
    lines = plain.splitlines()
    assert any(RESTARTING_ROUND_1.search(line) for line in lines), plain
    assert re.search(r"Running +round 1 +world 2", plain) and "Succeeded" in lines[-1], plain
    assert not processes_of(name)


def test_status_w_on_a_terminal_redraws_and_run_no_tty_prints_plain_lines(cli, tmp_path, terminals) -> None:
    name = "live-watch"
    run = cli.start("run", str(cli.write(job_yaml(name, ["--steps", "60", "--step-seconds", "0.1"]))),
                    "--log-dir", str(tmp_path / "logs"), "--no-tty")  # fmt: skip
    assert wait_until(lambda: submitted(cli, name), STARTUP), cli.output(run)
    watch = Terminal(["status", name, "-w", "--etcd", cli.etcd.client_url])
    terminals.append(watch)
    assert wait_until(lambda: "events" in watch.text(), STARTUP), watch.text()
    assert wait_until(lambda: running_at_step(cli, name, 5), STARTUP), cli.output(run)
    crash_one_training_process(cli, name)

    assert watch.wait(timeout=STARTUP + 60) == 0, watch.text()
    screen = watch.text()
    assert all(code in screen for code in REDRAW), screen
    assert RESTARTING_ROUND_1.search(screen) and "Succeeded" in screen, screen

    assert run.wait(timeout=60) == 0, cli.output(run)
    plain = cli.output(run)
    assert "\x1b" not in plain, plain
    assert any(RESTARTING_ROUND_1.search(line) for line in plain.splitlines()), plain
