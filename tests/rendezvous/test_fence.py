"""A worker of a round that has ended cannot publish a checkpoint the next round reads (issue 44): its agent
gives it a fencing token (its run and round, in `ELASTIC_FENCE`), and `elastic.train.checkpoint.publish`
renames the checkpoint into place only while that round is the job's current one. Real etcd, torch's own
launcher (stock torchrun, `etcd-v3`), the token read from a live worker's environment."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from elastic.rendezvous.fence import FENCE_ENV, RoundFence, fence_holds
from elastic.store import JobKeys
from harness.agents import wait_until

FENCE = RoundFence("http://127.0.0.1:2379", JobKeys("default", "j"), "run-1", 4)


@pytest.mark.parametrize(
    ("run_id", "round_number", "sealed", "holds"),
    [
        pytest.param("run-1", 4, True, True, id="the worker's round is the job's sealed round: it publishes"),
        pytest.param("run-1", 5, True, False, id="a later round was sealed: the worker's round has ended"),
        pytest.param("run-1", 5, False, False, id="its round was ended and the next is open"),
        pytest.param("run-1", 4, False, False, id="an open round of the same number is not the sealed one"),
        pytest.param("run-2", 4, True, False, id="a re-created job's round 4 is another run's"),
        pytest.param(None, None, False, False, id="the job's keys are gone"),
    ],
)
def test_fence_holds(run_id: str | None, round_number: int | None, sealed: bool, holds: bool) -> None:
    assert fence_holds(FENCE, run_id, round_number, sealed) is holds


def test_the_fence_travels_in_the_environment() -> None:
    assert RoundFence.from_env(FENCE.env()) == FENCE
    assert RoundFence.from_env({}) is None


PUBLISH = ("import sys; from pathlib import Path; from elastic.train.checkpoint import publish; "
          "tmp = Path(sys.argv[1]); tmp.write_text(sys.argv[3]); print(publish(tmp, sys.argv[2]))")


def publish_as(environ: dict[str, str], tmp: Path, path: Path, text: str) -> bool:
    out = subprocess.run([sys.executable, "-c", PUBLISH, str(tmp), str(path), text], env=environ,
                         capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    return out.stdout.strip() == "True"


def worker_environ(pid: int) -> dict[str, str]:
    block = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.decode().split("=", 1) for item in block.split(b"\0") if b"=" in item)


@pytest.mark.slow
def test_a_worker_of_an_ended_round_cannot_publish_a_checkpoint(training_job, tmp_path: Path) -> None:
    job = training_job(nnodes="1:2", steps=100_000)
    first = job.add_agent()  # python -m torch.distributed.run
    assert wait_until(lambda: len(job.steps()) >= 3 and len(first.worker_pids()) == 1, 120), job.logs()
    old = worker_environ(first.worker_pids()[0])
    assert json.loads(old[FENCE_ENV])["round"] == job.round()["round"]
    job.add_agent()  # a scale-up ends the round (free) and seals the next with both agents
    assert wait_until(lambda: any(s.world_size == 2 for s in job.steps()), 120), job.logs()
    (pid,) = first.worker_pids()
    current = worker_environ(pid)
    assert json.loads(current[FENCE_ENV])["round"] > json.loads(old[FENCE_ENV])["round"]

    path = tmp_path / "checkpoint.pt"
    path.write_text("the current round's")
    assert not publish_as(old, tmp_path / ".old.tmp", path, "an ended round's")
    assert path.read_text() == "the current round's" and not (tmp_path / ".old.tmp").exists()
    assert publish_as(current, tmp_path / ".new.tmp", path, "the next checkpoint")
    assert path.read_text() == "the next checkpoint"
