"""`elastic run` of a `recovery: InPlace` spec: the controller starts in-place agents; a crash is one charge."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from cli_harness import REPO, processes_of

pytestmark = pytest.mark.slow


def test_an_in_place_job_survives_a_crash_with_one_charge_and_succeeds(cli, tmp_path) -> None:
    logs = tmp_path / "logs"
    run = cli.start("run", str(REPO / "examples" / "inplace.yaml"), "--log-dir", str(logs), cwd=tmp_path)
    assert run.wait(timeout=240) == 0, cli.output(run)
    status = cli.status("inplace")
    assert status["phase"] == "Succeeded" and status["restarts"]["used"] == 1, status
    assert status["progress"]["step"] == 150 and status["progress"]["total"] == 150, "Session reports progress"
    text = "\n".join(p.read_text(errors="replace") for p in logs.rglob("*.log"))
    assert "local worker(s) [0] failed (exit 1): replaced in place" in text, text[-3000:]
    done = re.findall(r"^done step=150 applied=150 checksum=(\S+)", text, re.M)
    assert len(done) == 2 and len(set(done)) == 1, text[-3000:]
    assert not processes_of("inplace"), "nothing may be left running"


def test_in_place_refuses_a_worker_command_that_is_not_python(tmp_path) -> None:
    spec = (REPO / "examples" / "inplace.yaml").read_text()
    path = tmp_path / "bad.yaml"
    path.write_text(spec.replace('["python", "train_inplace.py"]', '["bash", "x.sh"]'))
    result = subprocess.run([sys.executable, "-m", "elastic.cli.main", "validate", str(path)],
                            capture_output=True, text=True, timeout=60)
    said = result.stdout + result.stderr
    assert result.returncode != 0 and "spec.recovery" in said and "use recovery: Restart" in said, said


def test_the_converted_ddp_tutorial_runs_in_place_through_its_crash(cli, tmp_path) -> None:
    """`elastic run examples/ddp_tutorial/job.yaml` as the README gives it: one charge, both ranks finish, and
    the run's files (snapshot, crash marker) go to the run's own directory, not into the examples."""
    logs = tmp_path / "logs"
    before = sorted(p.name for p in (REPO / "examples" / "ddp_tutorial").iterdir())
    run = cli.start("run", str(REPO / "examples" / "ddp_tutorial" / "job.yaml"), "--log-dir", str(logs), cwd=tmp_path)
    assert run.wait(timeout=240) == 0, cli.output(run)
    status = cli.status("ddp-tutorial")
    assert status["phase"] == "Succeeded" and status["restarts"]["used"] == 1, status
    text = "\n".join(p.read_text(errors="replace") for p in logs.rglob("*.log"))
    assert "crashing rank=1 batch=100" in text and "replaced in place" in text, text[-3000:]
    assert len(re.findall(r"^done rank=\d batches=\d+ pid=\d+$", text, re.M)) == 2, text[-3000:]
    assert sorted(p.name for p in (REPO / "examples" / "ddp_tutorial").iterdir()) == before
    assert any(logs.rglob("snapshot.pt")) and any(logs.rglob("crashed")), "the run's files are the run's"
    assert not processes_of("ddp-tutorial"), "nothing may be left running"
