"""No process dies of an etcd outage (issue 41): `elastic run`'s controller and live view, `status -w` and
`logs -f` wait for a paused etcd, say so once, and carry on when it answers. Before, `elastic run` exited 1
ten seconds into a 20 s pause ("did not answer get .../progress within 10 s"), stopping its workers and
leaving the job shown `Running`. Real etcd (this test's own, paused with SIGSTOP for 3 x the longest retry
bound of the commands, 10 s), real worker processes, gloo on CPU."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_harness import ElasticCli, job_yaml, processes_of

from elastic.store.server import EtcdServer
from harness.agents import wait_until

pytestmark = pytest.mark.slow

PAUSE_SECONDS = 30  # 3 x the longest retry bound of a call (10 s): every waiting call gives up at least twice


@pytest.fixture
def own_cli(stoppable_etcd_server: EtcdServer, tmp_path: Path) -> Iterator[ElasticCli]:
    """The commands against an etcd of this test's own: it is paused."""
    runner = ElasticCli(stoppable_etcd_server, tmp_path)
    yield runner
    runner.stop()


def test_elastic_run_status_and_logs_wait_out_a_paused_etcd_and_the_job_succeeds(
    own_cli: ElasticCli, stoppable_etcd_server: EtcdServer, tmp_path: Path
) -> None:
    cli, etcd = own_cli, stoppable_etcd_server
    job = job_yaml("outage", ["--steps", "100000", "--step-seconds", "0.02"])
    logs = tmp_path / "logs"
    run = cli.start("run", str(cli.write(job)), "--log-dir", str(logs), "--no-tty")
    assert wait_until(lambda: len(cli.steps(logs)) >= 5, 120), cli.output(run)
    watch = cli.start("status", "outage", "-w", "--no-tty")
    follow = cli.start("logs", "outage", "-f")
    assert wait_until(lambda: "Running" in cli.output(watch) and "step=" in cli.output(follow), 60), (
        cli.output(watch) + cli.output(follow))
    assert etcd.process is not None
    os.kill(etcd.process.pid, signal.SIGSTOP)
    try:
        time.sleep(PAUSE_SECONDS)  # the outage: its length is what the test is about
        for process in (run, watch, follow):
            assert process.poll() is None, f"exited during the outage:\n{cli.output(process)}"
    finally:
        os.kill(etcd.process.pid, signal.SIGCONT)
    resumed_at = time.time()
    assert wait_until(lambda: "etcd answers again" in cli.output(run), 60), cli.output(run)
    out = cli.output(run)
    assert out.count("etcd is unreachable since") == 1, "one line per outage, not one per retry:\n" + out
    # Longer than the lease, the outage fenced the workers; the job trains again, and the outage was free.
    assert wait_until(lambda: any(step.time > resumed_at for step in cli.steps(logs)), 120), cli.output(run)
    assert cli.budget("outage")["used"] == 0, cli.budget("outage")
    assert cli.status("outage")["phase"] == "Running"
    for process in (watch, follow):
        assert process.poll() is None, cli.output(process)
        assert cli.output(process).count("etcd is unreachable since") <= 1, cli.output(process)
    run.send_signal(signal.SIGINT)  # done: the job ends as on Ctrl-C, nothing left running
    assert run.wait(timeout=60) == 130, cli.output(run)
    assert wait_until(lambda: watch.poll() is not None and follow.poll() is not None, 60)
    assert not processes_of("outage")
