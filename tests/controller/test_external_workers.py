"""`elastic controller --backend external --submit JOB.yaml`: the controller docker-compose.yml runs (issue 24).

The platform (compose, here the test) starts the agents; the controller submits the spec, creates the run with
the spec's budget and reports the job, and starts or stops nothing. Real etcd, a real controller process,
real `elastic agent`s training with gloo.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path

import pytest
from cli_harness import ElasticCli, job_yaml

from elastic.cluster.external import ExternalAgents
from elastic.controller.submit import submit_job
from elastic.rendezvous.run import JobRun
from elastic.rendezvous.state import Member, Round, bucket_mask, bucket_of
from elastic.spec import parse_job
from elastic.store import JobKeys, Store
from harness.agents import AgentProcess, torchrun_command, wait_until

pytestmark = pytest.mark.slow

STARTUP = 90
AGENT = (sys.executable, "-m", "elastic.agent")


def test_the_controller_of_agents_a_platform_starts_runs_the_spec_and_starts_nothing(
    cli: ElasticCli, tmp_path: Path
) -> None:
    keys = JobKeys("default", "ext")
    spec = job_yaml("ext", ["--steps", "100000"], minReplicas=1, maxReplicas=3, replicas=2,
                    failurePolicy={"maxRestarts": 2})  # fmt: skip
    path = cli.write(spec)
    log_dir = tmp_path / "logs"
    controller = cli.start("controller", "--backend", "external", "--submit", str(path), "--log-dir", str(log_dir))
    # the run is the controller's, with the spec's budget, before any agent comes
    assert wait_until(lambda: cli.budget("ext").get("max") == 2, 30), cli.output(controller)
    assert cli.store.get_json(keys.run)["run_id"] == "ext"

    # what compose runs: agents of their own, whose max_restarts the submitted spec overrules
    args = [*spec["spec"]["worker"]["args"], "--checkpoint-dir", str(tmp_path / "ckpt")]
    command = torchrun_command(cli.etcd.client_url, "ext", "1:3", args, launcher=AGENT,
                               conf={"job": "default/ext", "lease_seconds": 3, "last_call_seconds": 1,
                                     "max_restarts": 9})  # fmt: skip
    env = {"ELASTIC_ETCD_ENDPOINTS": cli.etcd.client_url, "ELASTIC_PROGRESS_KEY": keys.progress}
    with ExitStack() as stack:
        agents = [stack.enter_context(AgentProcess(command, tmp_path / f"agent-{i}.log", env)) for i in range(2)]
        outputs = lambda: "\n".join([cli.output(controller), *(a.output() for a in agents)])  # noqa: E731

        def status_is(**fields: object) -> bool:
            status = cli.status("ext")
            return all(status.get(k) == v for k, v in fields.items())

        assert wait_until(lambda: status_is(phase="Running", worldSize=2, replicasText="2/2")
                          and cli.status("ext").get("progress", {}).get("step", 0) > 0, STARTUP), outputs()

        agents[0].kill_worker()  # a crash: one charge, of the spec's budget
        assert wait_until(lambda: status_is(phase="Running", worldSize=2, restartsText="1/2"), STARTUP), outputs()

        agents[0].kill()  # a lost node (the agent with its worker): the survivor trains on alone, the job says so
        assert wait_until(lambda: status_is(phase="Running", worldSize=1, replicasText="1/2", restartsText="2/2"),
                          STARTUP), outputs()

        # the status follows the sealed round, which comes before the survivor's new worker process does
        assert wait_until(lambda: bool(agents[1].worker_pids()), STARTUP), outputs()
        agents[1].kill_worker()  # the budget is spent: every agent's job is closed, and they exit non-zero
        assert wait_until(lambda: status_is(phase="Failed", reason="BackoffLimitExceeded"), STARTUP), outputs()
        assert agents[1].wait(60) != 0, outputs()

    assert controller.poll() is None, cli.output(controller)  # a controller runs on after its jobs
    assert cli.store.get_prefix(keys.workers_prefix)[0] == [], "the controller started a worker"
    assert not log_dir.exists() or not any(log_dir.rglob("*.log")), "the controller started a worker"

    # compose restarts a controller that died: the new one carries on with the job, never submits it again
    before = (cli.store.get_json(keys.spec), cli.store.get_json(keys.run), cli.budget("ext"))
    controller.terminate()
    controller.wait(30)
    again = cli.start("controller", "--backend", "external", "--submit", str(path), "--log-dir", str(log_dir))
    assert wait_until(lambda: "not submitted: job default/ext already exists" in cli.output(again), 30), \
        cli.output(again)
    assert (cli.store.get_json(keys.spec), cli.store.get_json(keys.run), cli.budget("ext")) == before
    assert cli.status("ext")["phase"] == "Failed"


def test_agents_that_come_before_their_controller_take_the_budget_of_the_submitted_spec(etcd_server) -> None:
    """Compose starts agents and controller together: whoever creates the run, a submitted spec's maxRestarts is
    the budget; an agent's own max_restarts counts only where no spec was submitted."""
    with Store(etcd_server.client_url) as store:
        submit_job(store, parse_job(job_yaml("first", [], failurePolicy={"maxRestarts": 2})))
        assert JobRun(store, JobKeys("default", "first")).ensure_run("first", 9, 60).budget.max == 2
        assert JobRun(store, JobKeys("default", "nospec")).ensure_run("nospec", 9, 60).budget.max == 9


def test_an_agent_a_sealed_round_left_behind_is_not_counted_while_its_key_lasts(etcd_server) -> None:
    """A lost agent's member key outlives it by up to its lease; the round that ended without it does not."""
    keys = JobKeys("default", "left")
    with Store(etcd_server.client_url) as store:
        sealed = Round(3, sealed=True, size=1, rank_buckets=bucket_mask([bucket_of("b-1-aa")]))
        store.put_json(keys.round, sealed.to_json())
        # the ranks, as a seal writes them
        store.put_json(keys.rank_bucket(bucket_of("b-1-aa")), {"round": 3, "ranks": {"b-1-aa": 0}})
        for member in (Member("a-1-aa", 2), Member("b-1-aa", 3), Member("c-1-aa", 4)):  # lost, in it, waiting
            store.put_json(keys.member(member.id), member.to_json())
        assert sorted(w.name for w in ExternalAgents(store, keys).observe()) == ["b-1-aa", "c-1-aa"]
        store.put_json(keys.round, Round(4, members={}).to_json())  # gathering: every key is a candidate
        assert len(ExternalAgents(store, keys).observe()) == 3
