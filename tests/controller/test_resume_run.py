"""Resume across runs, for real (etcd, torchrun agents): a job stopped after some steps is run again with
--resume and starts from its saved step; without --resume the same run is refused. Each run is started
from a directory other than the spec file's, with the spec's paths (the script, checkpointDir) relative to
the file."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest
import yaml
from cli_harness import SCRIPT, job_yaml, processes_of

from harness.agents import wait_until

pytestmark = pytest.mark.slow

STARTUP = 90
RESUMED = re.compile(r"started rank=0 world_size=\d+ resumed_from=(\d+)")


def resumed_from(log_dir: Path) -> list[int]:
    return [int(m) for log in log_dir.glob("*.log") for m in RESUMED.findall(log.read_text(errors="replace"))]


def test_a_stopped_job_run_again_with_resume_starts_from_its_saved_step(cli, tmp_path) -> None:
    specs, elsewhere = tmp_path / "specs", tmp_path / "elsewhere"
    specs.mkdir()
    elsewhere.mkdir()
    job = job_yaml("resumed", ["--steps", "40", "--step-seconds", "0.1"], checkpointDir="ckpt")
    job["spec"]["worker"]["command"] = ["python", os.path.relpath(SCRIPT, specs)]  # relative to the spec file
    (specs / "job.yaml").write_text(yaml.safe_dump(job))
    spec_file = os.path.relpath(specs / "job.yaml", elsewhere)

    first = cli.start("run", spec_file, "--log-dir", str(tmp_path / "logs1"), cwd=elsewhere)
    saved = lambda: cli.status("resumed").get("progress", {}).get("step", 0) >= 10  # noqa: E731
    assert wait_until(saved, STARTUP), cli.output(first)
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=60) == 130, cli.output(first)
    assert (specs / "ckpt" / "checkpoint.pt").is_file(), "checkpointDir is relative to the spec file"
    assert resumed_from(tmp_path / "logs1") == [0], "the first run started from scratch"

    refused = cli.run("run", spec_file, "--log-dir", str(tmp_path / "refused"), cwd=elsewhere)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"spec.checkpointDir: {specs / 'ckpt'} holds an earlier run's checkpoint" in refused.stderr
    assert "--resume" in refused.stderr and not (tmp_path / "refused").exists(), refused.stderr

    second = cli.start("run", spec_file, "--resume", "--log-dir", str(tmp_path / "logs2"), cwd=elsewhere)
    assert second.wait(timeout=STARTUP + 60) == 0, cli.output(second)
    starts = resumed_from(tmp_path / "logs2")
    assert starts and min(starts) >= 10, (starts, cli.output(second))
    steps = [s.step for s in cli.steps(tmp_path / "logs2")]
    assert steps[0] == min(starts) + 1 and steps[-1] == 40, steps
    assert not processes_of("resumed")
