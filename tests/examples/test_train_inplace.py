"""examples/train_inplace.py under stock torchrun: `Session`'s plain path (no in-place agent) trains the
same way, with rank 0's initial state broadcast to every rank, as DDP does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_inplace.py"
DONE = re.compile(r"^done step=(\d+) applied=(\d+) checksum=(\S+) pid=\d+$", re.M)

pytestmark = pytest.mark.slow


def test_stock_torchrun_trains_with_equal_state_on_every_rank(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELASTIC_")}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(SCRIPT), "--steps", "30"],
        capture_output=True, text=True, timeout=120, env={**env, "OMP_NUM_THREADS": "1"}, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    done = DONE.findall(result.stdout)
    assert len(done) == 2, result.stdout[-2000:]
    assert {(step, applied) for step, applied, _ in done} == {("30", "30")}
    assert len({checksum for *_, checksum in done}) == 1, "every rank ends with the same parameters"
