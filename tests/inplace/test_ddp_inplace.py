"""torch's DistributedDataParallel in place (issue 45, first step): a module built on the session's lasting
group (`elastic.train.DistributedDataParallel(model, process_group=session.process_group)`) keeps its
process, module and optimizer across a lost node (a worker crash: `test_inplace_recovery.py`, both ways);
DDP's own bucketed all-reduce carries the gradients, and the commit gate drops an interrupted step on every
rank. Real etcd, real in-place agents,
gloo on CPU."""

from __future__ import annotations

import re

import pytest
from test_inplace_recovery import assert_consistent, in_place_job, re_rank, worker_pid  # noqa: F401 (the fixture)

from harness.agents import wait_until

pytestmark = pytest.mark.slow


def test_ddp_trains_as_the_sessions_own_average_does(in_place_job) -> None:  # noqa: F811
    """Fault-free, float64: DDP's buckets averaged over the round give the same model as the session's flat
    all-reduce (the same data, order and arithmetic up to summation order)."""
    total = 40
    checksums = []
    for extra in ([], ["--ddp"]):
        job = in_place_job("2:2", ["--steps", str(total), "--dtype", "float64", *extra])
        for _ in range(2):
            job.add_agent()
        job.wait_finished(180)
        assert_consistent(job, total, ranks=2)
        checksums.append(float(job.done()[0][2]))
    assert abs(checksums[0] - checksums[1]) < 1e-9 * max(1.0, abs(checksums[0])), checksums


def test_a_lost_node_is_survived_in_place_by_ddp_modules(in_place_job) -> None:  # noqa: F811
    total = 200
    job = in_place_job("2:3", ["--ddp", "--steps", str(total), "--step-seconds", "0.03"], conf={"lease_seconds": 60})
    agents = [job.add_agent() for _ in range(3)]
    assert wait_until(lambda: any(s > 20 for s in job.steps()) and "world_size=3" in job.output(), 90), job.logs()
    before = {a.pid: worker_pid(a) for a in agents}
    victim = next(a for a in agents if re_rank(a) != 0)
    victim.kill()
    survivors = [a for a in agents if a is not victim]
    assert wait_until(lambda: all(a.returncode is not None for a in survivors), 180), job.logs()
    assert [a.returncode for a in survivors] == [0, 0], job.logs()
    done = job.done()
    assert {pid for *_, pid in done} == {before[a.pid] for a in survivors}, "survivors kept their processes"
    assert {(s, applied) for s, applied, _, _ in done} == {(total, total)} and len({c for _, _, c, _ in done}) == 1
    assert re.search(r"world_size=2 ", job.output()), "trained on at world size 2"
    budget = job.budget()
    assert budget["used"] == 1 and [c["reason"] for c in budget["charges"]] == ["MemberLost"], budget
