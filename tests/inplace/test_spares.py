"""Hot spares (issue 21, docs/design.md §3.18): an agent beyond the round's size waits warm outside it
(its zygote has torch imported, no worker runs) and the round a lost member ends takes it in at once.
Real etcd, real `elastic agent --recovery=in-place` agents, gloo."""

from __future__ import annotations

import time

import pytest
from test_inplace_recovery import in_place_job, re_rank  # noqa: F401 (the fixture)

from harness.agents import wait_until

pytestmark = pytest.mark.slow


def test_a_lost_member_is_replaced_by_the_warm_spare_at_full_size(in_place_job) -> None:  # noqa: F811
    total = 400
    job = in_place_job("2:3", ["--steps", str(total), "--step-seconds", "0.03"],
                       conf={"lease_seconds": 60, "spares": 1})  # fmt: skip
    agents = [job.add_agent() for _ in range(3)]
    assert wait_until(lambda: any(s > 20 for s in job.steps()), 120), job.logs()
    assert wait_until(lambda: sum(1 for a in agents if a.worker_pids()) == 2, 30), job.logs()
    (spare,) = [a for a in agents if not a.worker_pids()]
    assert all(s.world_size == 2 for a in agents for s in a.steps()), "the round has 2 members, not 3"
    victim = next(a for a in agents if a is not spare and re_rank(a) != 0)
    victim.kill()  # a node lost: agent and worker together
    killed_at = time.time()
    assert wait_until(lambda: bool(spare.worker_pids()), 30), "the spare is taken in: " + job.logs()
    assert wait_until(lambda: any(s.world_size == 2 and s.time > killed_at for a in agents for s in a.steps()),
                      30), "training at full size again, long before the 60 s lease: " + job.logs()
    back_at = min(s.time for a in agents for s in a.steps() if s.time > killed_at)
    print(f"node loss -> full size again with the spare: {back_at - killed_at:.2f} s")
    survivors = [a for a in agents if a is not victim]
    assert wait_until(lambda: all(a.returncode is not None for a in survivors), 180), job.logs()
    assert [a.returncode for a in survivors] == [0, 0], job.logs()
    budget = job.budget()
    assert budget["used"] == 1 and [c["reason"] for c in budget["charges"]] == ["MemberLost"], budget
    done = job.done()
    assert {(step, applied) for step, applied, _, _ in done} == {(total, total)} and len({c for *_, c, _ in done}) == 1
