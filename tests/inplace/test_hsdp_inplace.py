"""HSDP in place (issue 45): an FSDP2 model sharded over 2 ranks per node, replicated across nodes, through a
worker crash, a node loss, a scale-up and a scale-down; every epoch's samples read once, and the parameters
those of a fault-free replay.

Real etcd, real `elastic agent --recovery=in-place` agents with 2 workers each (one replica of the model per
node, `examples/train_inplace.py --hsdp 2`: each Linear and the whole `fully_shard()`ed on the session's
device mesh), gloo on CPU, float64. A crashed worker's replacement gets its shard from that shard's holder
in the other replica, in memory; a lost node takes a whole replica and the survivors train on as one; a new
node's two workers receive one shard each from the survivors. The checks are `test_exactly_once`'s: the
committed steps' ids epoch by epoch, and a replay in this process from the seed and the logged world sizes
(FSDP's reduce-scatter and the replicas' all-reduce add the ranks' gradients in orders of their own, hence
the tolerance, with a check that one skipped sample moves the parameters by more than 10 x that).

With one worker per agent (a 2 x 2 mesh over 4 agents), a lost agent leaves 3 ranks, which cannot be whole
replicas of 2: they wait, keeping their shards, until a fourth agent joins and receives the lost shard.
"""

from __future__ import annotations

import os
import random
import time

import pytest
from test_exactly_once import DONE, check_committed_run, lose_grow_and_shrink, train_to
from test_inplace_recovery import RECOVERED, in_place_job  # noqa: F401 (the fixture)

from harness.agents import AgentProcess, wait_until

pytestmark = pytest.mark.slow

DATASET, BATCH, HIDDEN, TOTAL = 300, 4, 32, 240


def ranks_now(agent: AgentProcess) -> set[int]:
    """The ranks of the agent's workers in the newest round they reported."""
    found = [(int(m[1]), int(m[2])) for m in RECOVERED.finditer(agent.output())]
    newest = max((r for r, _ in found), default=None)
    return {rank for r, rank in found if r == newest}


def test_hsdp_survives_a_crash_a_node_loss_a_scale_up_and_down_in_place(in_place_job, tmp_path):  # noqa: F811
    seed = int(os.environ.get("ELASTIC_EXACTLY_ONCE_SEED") or time.time_ns() % 1_000_000)
    draw = random.Random(seed)
    crash_at = draw.randint(15, 40)
    final = tmp_path / "final.pt"
    job = in_place_job("1:2", ["--hsdp", "2", "--steps", str(TOTAL), "--step-seconds", "0.06",
                               "--hidden", str(HIDDEN), "--dataset-size", str(DATASET), "--batch-size", str(BATCH),
                               "--seed", str(seed), "--dtype", "float64", "--log-samples",
                               "--crash-at-step", str(crash_at), "--crash-marker", str(tmp_path / "crashed"),
                               "--save-final", str(final)], nproc_per_node=2)
    note = f"seed {seed} (ELASTIC_EXACTLY_ONCE_SEED={seed} replays it)\n"
    first = [job.add_agent() for _ in range(2)]

    train_to(job, crash_at + draw.randint(10, 25), 4, after=0)  # rank 1 crashed and was replaced, in place
    assert "crashing rank=1" in job.output(), note + job.logs()
    replaced = [line for line in job.output().splitlines() if line.startswith("recovered ") and "bytes=0 " not in line]
    assert replaced, note + "the replacement received its shard from a peer: " + job.logs()
    lost = next(a for a in first if 0 not in ranks_now(a))
    # a node loss (a whole replica), a scale-up (a new replica, each worker receiving its shard), a scale-down
    stayed = lose_grow_and_shrink(job, lost, draw, 2, 4, lambda: next(
        a for a in job.agents if a.returncode is None and 0 not in ranks_now(a)), note)

    done = DONE.findall(job.output())
    assert len(done) == 2 * len(stayed) and len({checksum for *_, checksum in done}) == 1, note + job.logs()
    check_committed_run(job, note, seed, TOTAL, final, worlds=[2, 4])
    budget = job.budget()
    assert [c["reason"] for c in budget["charges"]] == ["WorkerFailure", "MemberLost"], note + str(budget)


def test_hsdp_with_one_worker_per_agent_waits_for_whole_replicas_after_a_node_loss(in_place_job, tmp_path):  # noqa: F811
    seed = int(os.environ.get("ELASTIC_EXACTLY_ONCE_SEED") or time.time_ns() % 1_000_000)
    draw = random.Random(seed)
    final = tmp_path / "final.pt"
    total = 120
    job = in_place_job("3:4", ["--hsdp", "2", "--steps", str(total), "--step-seconds", "0.06",
                               "--hidden", str(HIDDEN), "--dataset-size", str(DATASET), "--batch-size", str(BATCH),
                               "--seed", str(seed), "--dtype", "float64", "--log-samples",
                               "--save-final", str(final)])
    note = f"seed {seed} (ELASTIC_EXACTLY_ONCE_SEED={seed} replays it)\n"
    agents = [job.add_agent() for _ in range(4)]
    train_to(job, draw.randint(15, 40), 4, after=0)
    lost = next(a for a in agents if 0 not in ranks_now(a))
    lost.kill()
    assert wait_until(lambda: "cannot train in place (a world of 3 ranks is not a multiple of the shard size 2"
                      in job.output(), 60), note + job.logs()
    waited_at = max(s.step for a in job.agents for s in a.steps())
    job.add_agent()  # the lost shard comes back from its holder in the other replica
    at = time.time()
    train_to(job, waited_at + 1, 4, after=at)
    stayed = [a for a in job.agents if a is not lost]
    assert wait_until(lambda: all(a.returncode is not None for a in stayed), 180), note + job.logs()
    assert [a.returncode for a in stayed] == [0] * len(stayed), note + job.logs()
    check_committed_run(job, note, seed, total, final, worlds=[4])  # no step trained at 3 ranks
    assert [c["reason"] for c in job.budget()["charges"]] == ["MemberLost"], note
