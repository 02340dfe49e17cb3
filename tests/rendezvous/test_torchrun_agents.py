"""Stories of stock torchrun agents on the etcd-v3 backend: real etcd, real processes, gloo on CPU.

Timing bounds are generous (two noisy cores run etcd, agents and workers); speed is measured in bench/.
"""

from __future__ import annotations

import sys
import time

import pytest

from harness.agents import wait_until

pytestmark = pytest.mark.slow

STARTUP = 90  # seconds for agents to import torch, rendezvous and reach the first step on a busy machine


def test_two_agents_train_to_completion_and_leave_only_expiring_keys(training_job) -> None:
    job = training_job(steps=30)
    agents = [job.add_agent(), job.add_agent()]
    for agent in agents:
        assert agent.wait(timeout=STARTUP + 60) == 0, job.logs()
    steps = job.steps()
    assert steps[-1].step == 30 and {s.world_size for s in steps} == {2}
    assert [s.step for s in steps] == sorted(s.step for s in steps)
    assert job.budget()["used"] == 0
    assert job.closed()["reason"] == "Succeeded"
    entries, _ = job.store.get_prefix(job.keys.prefix)
    assert entries, "the run's state should still be readable after it ended"
    unleased = [e.key for e in entries if e.lease == 0]
    assert not unleased, f"keys without a lease (they would never expire): {unleased}"
    assert not any("/members/" in e.key for e in entries), "members leave with their lease"


def test_worker_crash_costs_one_charge_and_both_agents_resume(training_job) -> None:
    job = training_job(conf={"max_restarts": 20})
    agents = [job.add_agent(), job.add_agent()]
    assert wait_until(lambda: len(job.steps()) >= 5, STARTUP), job.logs()
    for incident in range(1, 11):
        killed_at = time.time()
        agents[incident % 2].kill_worker()
        # recovered once both agents train again and have passed a checkpoint (every 5 steps)
        assert wait_until(
            lambda t=killed_at: len([s for s in job.steps_since(t + 0.1) if s.world_size == 2]) >= 6, 90
        ), f"incident {incident}: no recovery\n{job.logs()}"
        assert job.budget()["used"] == incident, job.budget()
        before = [s.step for s in job.steps() if s.time <= killed_at]
        resumed = job.steps_since(killed_at + 0.1)[0].step
        assert max(before) - 5 <= resumed - 1 <= max(before) + 1, "resumed from the last checkpoint, not from 0"
    charges = job.budget()["charges"]
    assert len({c["round"] for c in charges}) == 10, "one charge per incident, each for its own round"
    assert max(s.step for s in job.steps()) >= 10 * 5, "training made progress across the recoveries"


def test_node_loss_survivor_trains_alone_within_lease_and_last_call(training_job) -> None:
    job = training_job(nnodes="1:2", conf={"max_restarts": 5, "lease_seconds": 3, "last_call_seconds": 1})
    agents = [job.add_agent(), job.add_agent()]
    assert wait_until(lambda: len(job.steps()) >= 5, STARTUP), job.logs()
    rank1 = next(a for a in agents if _rank_of(job, a) == 1)
    lost = next(m for m in job.round()["members"] if f"-{rank1.pid}-" in m)
    lost_key = job.keys.member(lost)
    killed_at = time.time()
    rank1.kill()
    assert wait_until(lambda: any(s.world_size == 1 for s in job.steps_since(killed_at)), 3 + 1 + 5 + 10), job.logs()
    assert job.budget()["used"] == 1, job.budget()
    # stock torchrun tells its handler nothing of its worker's exit: the silent member is the lost one, never
    # the survivor whose all-reduce broke with it (docs/design.md §3.16)
    charge = job.budget()["charges"][0]
    assert (charge["reason"], charge["member"]) == ("MemberLost", lost), charge
    assert charge["cause"] == f"NodeLost of worker {lost}", charge
    # the dead member's lease runs out afterwards: that is not a second incident
    assert wait_until(lambda: job.store.get(lost_key) is None, 3 + 5)
    expired_at = time.time()
    assert wait_until(lambda: len(job.steps_since(expired_at)) >= 3, 30), "training goes on after the expiry"
    assert job.budget()["used"] == 1, job.budget()


def test_losing_the_rank0_agent_does_not_end_the_job(training_job) -> None:
    job = training_job(conf={"max_restarts": 5})
    agents = [job.add_agent(), job.add_agent()]
    assert wait_until(lambda: len(job.steps()) >= 5, STARTUP), job.logs()
    rank0 = next(a for a in agents if _rank_of(job, a) == 0)
    survivor = next(a for a in agents if a is not rank0)
    killed_at = time.time()
    rank0.kill()
    assert wait_until(lambda: any(s.world_size == 1 for s in job.steps_since(killed_at)), 30), job.logs()
    assert survivor.returncode is None, "the surviving agent goes on"
    assert job.closed() is None


def test_late_joiner_grows_the_round_for_free(training_job) -> None:
    job = training_job(nnodes="1:3", conf={"max_restarts": 0})
    job.add_agent()
    job.add_agent()
    assert wait_until(lambda: any(s.world_size == 2 for s in job.steps()), STARTUP), job.logs()
    joined_at = time.time()
    job.add_agent()
    assert wait_until(lambda: any(s.world_size == 3 for s in job.steps_since(joined_at)), STARTUP), job.logs()
    assert job.budget()["used"] == 0, "a late joiner never charges the budget"
    assert job.closed() is None
    assert job.round()["opened_by"] == "ScaleUp"


def test_spent_budget_closes_the_job_for_every_agent(training_job) -> None:
    job = training_job(conf={"max_restarts": 1})
    agents = [job.add_agent(), job.add_agent()]
    assert wait_until(lambda: len(job.steps()) >= 5, STARTUP), job.logs()
    first_at = time.time()
    agents[0].kill_worker()
    assert wait_until(lambda: any(s.world_size == 2 for s in job.steps_since(first_at + 0.1)), 90), job.logs()
    agents[1].kill_worker()
    for agent in agents:
        assert wait_until(lambda a=agent: a.returncode is not None, 30), job.logs()
        assert agent.returncode != 0
        assert "restart budget spent" in agent.output()
    closed = job.closed()
    assert closed["reason"] == "BackoffLimitExceeded"
    assert "2 failure(s) > maxRestarts 1" in closed["message"]
    assert [c["reason"] for c in job.budget()["charges"]] == ["WorkerFailure", "WorkerFailure"]


def test_runs_are_isolated_and_a_closed_run_id_is_refused_unless_reset(training_job) -> None:
    first = training_job(nnodes="1:1", steps=10, run_id="iso-a")
    second = training_job(nnodes="1:1", steps=10, run_id="iso-b")
    agents = [first.add_agent(), second.add_agent()]
    for agent in agents:
        assert agent.wait(timeout=STARTUP + 60) == 0, first.logs() + second.logs()
    assert first.round()["members"].keys().isdisjoint(second.round()["members"].keys())
    again = first.add_agent()
    assert again.wait(timeout=STARTUP) != 0
    assert "start a new run with another --rdzv-id" in again.output()
    reset = first.add_agent(reset=1)
    assert reset.wait(timeout=STARTUP + 60) == 0, first.logs()


def test_etcd_has_no_v2_api(etcd_server) -> None:
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(f"{etcd_server.client_url}/v2/keys/", timeout=5)
    assert caught.value.code == 404


def _rank_of(job, agent) -> int:
    members = job.round()["members"]
    pid = agent.pid
    for member_id, rank in members.items():
        if f"-{pid}-" in member_id:
            return rank
    raise AssertionError(f"agent {pid} not in round {members}")


ELASTIC_AGENT = (sys.executable, "-m", "elastic.agent")


def _submit_spec(job, rules: list[dict]) -> None:
    """What the controller does for a submitted ElasticJob: the spec (with its rules) lands in etcd."""
    job.store.put_json(job.keys.spec, {
        "apiVersion": "elastic.dev/v1alpha1", "kind": "ElasticJob",
        "metadata": {"name": job.keys.name, "namespace": job.keys.namespace},
        "spec": {"minReplicas": 1, "maxReplicas": 2, "worker": {"command": ["python"]},
                 "failurePolicy": {"maxRestarts": 5, "rules": rules}},
    })


def test_elastic_agent_applies_a_fail_job_rule_to_the_worker_exit_code(training_job) -> None:
    job = training_job(conf={"max_restarts": 5}, extra_args=["--crash-at-step", "8", "--crash-exit-code", "3"])
    _submit_spec(job, [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}])
    agents = [job.add_agent(launcher=ELASTIC_AGENT), job.add_agent(launcher=ELASTIC_AGENT)]
    for agent in agents:
        assert wait_until(lambda a=agent: a.returncode is not None, STARTUP + 30), job.logs()
        assert agent.returncode != 0
    closed = job.closed()
    assert closed["reason"] == "FailJobRule", closed
    assert "exit code 3" in closed["message"] and "rules[0]" in closed["message"]
    assert job.budget()["used"] == 0, "a permanent failure closes the job without spending the budget"


def test_elastic_agent_charges_a_retryable_exit_code_once(training_job) -> None:
    marker = f"/tmp/elastic-crash-once-{time.time_ns()}"
    job = training_job(steps=20, conf={"max_restarts": 5},
                       extra_args=["--crash-at-step", "8", "--crash-exit-code", "137", "--crash-once-marker", marker])
    _submit_spec(job, [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}])
    agents = [job.add_agent(launcher=ELASTIC_AGENT), job.add_agent(launcher=ELASTIC_AGENT)]
    for agent in agents:
        assert agent.wait(timeout=STARTUP + 60) == 0, job.logs()
    charges = job.budget()["charges"]
    assert len(charges) == 1 and charges[0]["exit_code"] == 137, charges
    assert job.closed()["reason"] == "Succeeded"


def test_an_agent_that_cannot_join_in_time_gets_a_clear_error(training_job) -> None:
    job = training_job(nnodes="2:2", conf={"join_timeout": 3})
    lonely = job.add_agent()
    assert lonely.wait(timeout=STARTUP) != 0
    output = lonely.output()
    assert "could not join a round" in output and "within 3 s" in output and "need 2 to 2 members" in output


def test_a_bad_key_fails_the_rendezvous_naming_it_and_is_never_charged(training_job) -> None:
    job = training_job(nnodes="1:1", steps=10)
    job.store.put(job.keys.member("hand-edited"), "not json{")  # what anyone with etcdctl can do
    refused = job.add_agent()
    assert refused.wait(timeout=STARTUP) != 0
    assert f"corrupt value at {job.keys.member('hand-edited')}: not JSON" in refused.output(), job.logs()
    assert job.budget()["used"] == 0 and job.closed() is None, "a bad key is not a failure of the job"
    job.store.delete(job.keys.member("hand-edited"))
    fixed = job.add_agent()
    assert fixed.wait(timeout=STARTUP + 60) == 0, job.logs()
    assert job.budget()["used"] == 0 and job.closed()["reason"] == "Succeeded"


def test_a_second_agent_arriving_late_still_makes_the_round_of_min_nodes(training_job) -> None:
    """`--nnodes=2`: the first agent holds the round until the second joins, seconds later (as c10d does)."""
    job = training_job(nnodes="2:2", steps=20)
    first = job.add_agent()
    members = job.keys.members_prefix
    assert wait_until(lambda: job.store.get_prefix(members)[0], STARTUP), job.logs()
    time.sleep(3)  # the scenario itself: the second agent arrives seconds after the first joined
    second = job.add_agent()
    for agent in (first, second):
        assert agent.wait(timeout=STARTUP + 60) == 0, job.logs()
    assert {s.world_size for s in job.steps()} == {2}
    assert job.closed()["reason"] == "Succeeded" and job.budget()["used"] == 0
