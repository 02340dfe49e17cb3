"""Notice is used (issue 21): SIGTERM to an in-place agent (a pod deleted with grace, a spot reclaim notice)
leaves its round as a stop on purpose before its workers stop: free, and the survivors carry on in place.
Real etcd, real `elastic agent --recovery=in-place` agents, gloo."""

from __future__ import annotations

import os
import signal
import time

import pytest
from test_inplace_recovery import in_place_job, re_rank, worker_pid  # noqa: F401 (the fixture)

from harness.agents import wait_until

pytestmark = pytest.mark.slow


def test_sigterm_to_an_agent_is_a_free_departure_and_the_survivors_train_on(in_place_job) -> None:  # noqa: F811
    total = 200
    job = in_place_job("2:3", ["--steps", str(total), "--step-seconds", "0.03"], conf={"lease_seconds": 60})
    agents = [job.add_agent() for _ in range(3)]
    assert wait_until(lambda: any(s > 20 for s in job.steps()) and "world_size=3" in job.output(), 90), job.logs()
    survivors_before = {a.pid: worker_pid(a) for a in agents}
    leaving = next(a for a in agents if re_rank(a) != 0)
    os.kill(leaving.pid, signal.SIGTERM)  # the agent only: its own stop must take its workers with it
    noticed_at = time.time()
    survivors = [a for a in agents if a is not leaving]
    assert wait_until(lambda: leaving.returncode is not None, 30), leaving.output()
    assert wait_until(lambda: any(s.world_size == 2 and s.time > noticed_at for a in survivors for s in a.steps()),
                      30), "trained on at world size 2, long before the 60 s lease: " + job.logs()
    assert wait_until(lambda: all(a.returncode is not None for a in survivors), 120), job.logs()
    assert [a.returncode for a in survivors] == [0, 0], job.logs()
    assert {pid for *_, pid in job.done()} == {survivors_before[a.pid] for a in survivors}, "survivors stayed"
    assert job.budget()["used"] == 0, job.budget()
