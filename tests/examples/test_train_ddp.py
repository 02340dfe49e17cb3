"""examples/train_ddp.py under stock torchrun: the workload every elastic test and benchmark relies on.

Why: the rendezvous and policy tests read this script's step lines to judge recoveries, so its resume
and crash-once behaviour must hold on its own, with torch's standalone rendezvous and no etcd.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"
TIMEOUT_SECONDS = 120

STEP_LINE = re.compile(
    r"^step=(?P<step>\d+) loss=(?P<loss>\d+\.\d{4}) world_size=(?P<ws>\d+) "
    r"restart=(?P<restart>\d+) time=(?P<time>\d+\.\d{3})$"
)
STARTED_LINE = re.compile(r"^started rank=(?P<rank>\d+) world_size=(?P<ws>\d+) resumed_from=(?P<step>\d+)$")
DONE_LINE = re.compile(r"^done step=(?P<step>\d+)$")

pytestmark = pytest.mark.slow


def torchrun(
    tmp_path: Path, *script_args: str, torchrun_args: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the script with stock torchrun on this host: 2 gloo workers, one thread each (2 shared cores)."""
    run_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    for var in ("ELASTIC_PROGRESS_KEY", "ELASTIC_ETCD_ENDPOINTS", "ELASTIC_CHECKPOINT_DIR"):
        run_env.pop(var, None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "--monitor-interval=0.1",
        *torchrun_args,
        str(SCRIPT),
        "--step-seconds",
        "0",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        *script_args,
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=run_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        # SIGTERM, not SIGKILL: torchrun then stops its workers, which live in their own sessions and
        # would otherwise outlive the test.
        proc.terminate()
        try:
            stdout, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        pytest.fail(f"torchrun ran past {TIMEOUT_SECONDS} s\nstdout:\n{stdout}\nstderr:\n{stderr}")
    result = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    return result


def steps(out: str) -> list[re.Match[str]]:
    return [m for line in out.splitlines() if (m := STEP_LINE.match(line.strip()))]


def started(out: str) -> list[re.Match[str]]:
    return [m for line in out.splitlines() if (m := STARTED_LINE.match(line.strip()))]


def done(out: str) -> list[int]:
    return [int(m["step"]) for line in out.splitlines() if (m := DONE_LINE.match(line.strip()))]


def test_trains_then_resumes_from_checkpoint(tmp_path: Path) -> None:
    first = torchrun(tmp_path, "--steps", "30")
    lines = steps(first.stdout)
    assert [int(m["step"]) for m in lines] == list(range(1, 31)), first.stdout
    assert {m["ws"] for m in lines} == {"2"}
    assert {m["restart"] for m in lines} == {"0"}
    assert sorted((int(m["rank"]), int(m["ws"]), int(m["step"])) for m in started(first.stdout)) == [
        (0, 2, 0),
        (1, 2, 0),
    ]
    assert done(first.stdout) == [30]
    assert (tmp_path / "ckpt" / "checkpoint.pt").is_file()
    assert float(lines[-1]["loss"]) < float(lines[0]["loss"]), "the model should learn something"

    second = torchrun(tmp_path, "--steps", "40")
    assert {int(m["step"]) for m in started(second.stdout)} == {30}
    assert [int(m["step"]) for m in steps(second.stdout)] == list(range(31, 41)), second.stdout
    assert done(second.stdout) == [40]


def test_crash_once_then_restart_resumes_from_last_checkpoint(tmp_path: Path) -> None:
    marker = tmp_path / "crashed.marker"
    result = torchrun(
        tmp_path,
        "--steps",
        "12",
        "--checkpoint-every",
        "2",
        "--crash-at-step",
        "5",
        "--crash-exit-code",
        "137",
        "--crash-once-marker",
        str(marker),
        torchrun_args=("--max-restarts=1",),
        # Stock torchrun reuses one TCPStore for the workers of every restart, without a per-attempt
        # prefix: the restarted gloo group may read the dead group's addresses and fail or hang
        # (pytorch#135712; 2 of 4 runs here). torch's own opt-out gives each attempt a fresh store.
        env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
    )
    assert marker.is_file(), "rank 1 should have crashed once"
    lines = steps(result.stdout)
    before = [int(m["step"]) for m in lines if m["restart"] == "0"]
    after = [int(m["step"]) for m in lines if m["restart"] == "1"]
    # Steps 1-4 ran (checkpoint at 4, committed before anyone went on); rank 1 died at the top of step 5.
    assert before == [1, 2, 3, 4], result.stdout
    resumed = [int(m["step"]) for m in started(result.stdout) if int(m["step"]) > 0]
    assert resumed == [4, 4], result.stdout
    # The restarted round never goes below the last checkpoint and runs to the end.
    assert after == list(range(5, 13)), result.stdout
    assert done(result.stdout) == [12]
