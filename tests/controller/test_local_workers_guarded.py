"""Local workers under one fenced controller: adopted exit codes, refused chaos, no unrecorded process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_harness import REPO

from elastic.cluster.base import WorkerLaunch
from elastic.cluster.local import ENDPOINTS_ENV, EXIT_KEY_ENV, LocalProcesses, exit_status
from elastic.cluster.processes import pids_with_env
from elastic.controller.machinery.etcd_election import Election
from elastic.controller.reconcile import HandleExit, Observed, reconcile
from elastic.errors import NotLeaderError
from elastic.policy.exits import Action
from elastic.rendezvous.run import JobRun
from elastic.spec import parse_job
from elastic.store import JobKeys, Store
from elastic.store.keys import controller_leader_key
from elastic.store.server import EtcdServer
from harness.agents import wait_until

FAKE_AGENT = "import sys\nfrom elastic.cluster.local import exit_recorded\nwith exit_recorded():\n" \
             "    sys.stdin.readline()\n    sys.exit(3)\n"  # fmt: skip


@pytest.mark.parametrize(
    ("error", "code"),
    [(None, 0), (SystemExit(None), 0), (SystemExit(3), 3), (SystemExit("bad"), 1), (RuntimeError(), 1),
     (KeyboardInterrupt(), -2)],
    ids=["return", "sys.exit()", "sys.exit(3)", "sys.exit(message)", "an exception", "Ctrl-C"],
)  # fmt: skip
def test_exit_status_is_what_a_parent_would_see(error: BaseException | None, code: int) -> None:
    assert exit_status(error) == code


FAIL_ON_3 = {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}]}


def test_an_adopted_worker_exiting_3_is_classified_by_its_rule(etcd_server: EtcdServer, tmp_path: Path) -> None:
    job = parse_job({"apiVersion": "elastic.dev/v1alpha1", "kind": "ElasticJob", "metadata": {"name": "adopt-3"},
                     "spec": {"minReplicas": 1, "maxReplicas": 1, "replicas": 1,
                              "worker": {"command": ["python", "train.py"]}, "failurePolicy": FAIL_ON_3}})  # fmt: skip
    keys = JobKeys("default", "adopt-3")
    name = "adopt-3-beef"
    with Store(etcd_server.client_url) as store:
        run = JobRun(store, keys)
        run.ensure_run("adopt-3", 3, 60)
        # A worker an earlier controller started: its agent is not our child.
        agent = subprocess.Popen(
            [sys.executable, "-c", FAKE_AGENT], stdin=subprocess.PIPE, cwd=REPO,
            env={**os.environ, "ELASTIC_WORKER": name, EXIT_KEY_ENV: keys.worker_exit(name),
                 ENDPOINTS_ENV: etcd_server.client_url},
        )  # fmt: skip
        store.put_json(keys.worker(name), {"pid": agent.pid, "started_at": time.time(), "log": ""})
        workers = LocalProcesses(store, keys, tmp_path, tmp_path / "checkpoints")
        assert [w.alive for w in workers.observe()] == [True]
        agent.communicate(b"\n", timeout=30)
        assert wait_until(lambda: not workers.observe()[0].alive, 10)
        observed = workers.observe()
        assert observed[0].exit_code == 3, "the agent's own record gives the adopted worker's exit code"
        actions = reconcile(Observed(job, run.read(), tuple(observed)))
        exits = [a for a in actions if isinstance(a, HandleExit)]
        assert [a.incident.action for a in exits] == [Action.FAIL_JOB], actions
        workers.forget(name)
        assert store.get(keys.worker_exit(name)) is None
        store.delete_prefix(keys.prefix)


def test_chaos_kill_refuses_a_pid_that_is_not_the_worker(etcd_server: EtcdServer) -> None:
    keys = JobKeys("default", "chaos-guard")
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        with Store(etcd_server.client_url) as store:
            store.put_json(keys.worker("chaos-guard-0001"), {"pid": bystander.pid, "started_at": 0, "log": ""})
            result = subprocess.run(
                [sys.executable, "-m", "elastic.cli.main", "chaos", "kill", "chaos-guard", "--worker",
                 "chaos-guard-0001", "--etcd", etcd_server.client_url],
                cwd=REPO, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            store.delete_prefix(keys.prefix)
        assert result.returncode == 1 and "nothing was signalled" in result.stderr, result
        assert bystander.poll() is None, "an unrelated process survives"
    finally:
        bystander.kill()
        bystander.wait()


def test_a_deposed_leader_leaves_no_worker_it_could_not_record(etcd_server: EtcdServer, tmp_path: Path) -> None:
    keys = JobKeys("default", "deposed")
    with Store(etcd_server.client_url) as store:
        election = Election(store)
        fenced = election.lead()
        assert fenced is not None
        workers = LocalProcesses(fenced, keys, tmp_path, tmp_path / "checkpoints")
        store.revoke(election.read().lease)
        with pytest.raises(NotLeaderError):
            workers.start(WorkerLaunch("deposed-0001", ["sleep", "60"], {}))
        assert not pids_with_env("ELASTIC_WORKER=deposed-0001")
        assert store.get(keys.worker("deposed-0001")) is None
        election.resign()
        store.delete(controller_leader_key())
