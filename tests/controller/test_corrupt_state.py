"""A bad value under one job's keys is a condition of that job: nothing crashes, nothing is charged.

Real etcd; the controller is the real JobController with real local WorkerSets (no worker is started:
a job whose state does not decode gets no action at all, which is what these cases check).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from elastic.cluster.local import LocalProcesses
from elastic.codec import CORRUPT_STATE
from elastic.controller.loop import JobController
from elastic.controller.manager import local_workers
from elastic.controller.submit import list_jobs, submit_job
from elastic.rendezvous.run import JobRun
from elastic.spec import parse_job
from elastic.store import JobKeys, Store
from elastic.store.server import EtcdServer


def job(name: str):
    return parse_job({
        "apiVersion": "elastic.dev/v1alpha1", "kind": "ElasticJob", "metadata": {"name": name},
        "spec": {"minReplicas": 1, "maxReplicas": 2, "worker": {"command": ["python", "-c", "pass"]}},
    })


# (key under the job's prefix, bad value)
CASES = [
    ("progress", "not json{"),
    ("progress", "5"),
    ("progress", '{"step":"x"}'),
    ("status", '{"phase":5}'),
    ("status", '{"phase":"Running","startTime":"yesterday"}'),
    ("spec", "not json"),
    ("spec", '{"apiVersion":"elastic.dev/v1alpha1","kind":"ElasticJob","metadata":{"name":"victim"},'
             '"spec":{"minReplicas":1,"maxReplicas":0,"worker":{"command":["x"]}}}'),
    ("round", "garbage"),
    ("round", '{"round":"1"}'),
    ("round", '{"round":-1}'),
    ("budget", '{"max":"3"}'),
    ("budget", '{"max":3,"used":1,"charges":[{"round":0}]}'),
    ("run", "[]"),
    ("members/m1", '{"round":true}'),
    ("closed", '{"reason":1}'),
    ("departed/m1", "null"),
    ("done/m1", '{"round":"0"}'),
    ("incidents/0/m1", '{"exit_code":"137"}'),
    ("alive/0/m1", '{"at":"now"}'),
    ("workers/w1", '{"pid":"12"}'),
    # absurd numbers (issue 22): each bounded, each CorruptState on its own job
    ("round", '{"round":100000000000000000000000000}'),
    ("membership/ranks/0", '{"round":0,"ranks":{"m1":4294967296}}'),
    ("membership/ranks/0", '["m1"]'),
    ("membership/ranks/0", '{"m1":0}'),
    ("membership/ranks/0", '{"round":0,"ranks":{},"expected":"m1"}'),
    ("sealer", '{"member":7}'),
    ("round", '{"round":0,"sealed":true,"world_size":1,"rank_buckets":281474976710656}'),
    ("round", '{"round":1,"opened_at":1e300}'),
    ("budget", '{"max":3,"used":99999999999999999999}'),
    ("members/m1", '{"round":0,"pid":99999999999999999999}'),
    ("progress", '{"step":100000000000000000000000}'),
    ("incidents/0/m1", '{"exit_code":99999999999999999999}'),
    ("run", '{"run_id":"r","lease":100000000000000000000000}'),
]


@pytest.fixture
def two_jobs(etcd_server: EtcdServer, tmp_path: Path):
    store = Store(etcd_server.client_url, retry_seconds=5)
    controllers = {}
    for name in ("victim", "bystander"):
        submitted = submit_job(store, job(name))
        keys = JobKeys("default", name)
        JobRun(store, keys).ensure_run(submitted.metadata.uid, 3, 60)
        workers = local_workers(store, submitted, tmp_path / name)
        controllers[name] = JobController(store, submitted, workers, etcd_server.client_url)
    yield store, controllers
    for name in ("victim", "bystander"):
        store.delete_prefix(JobKeys("default", name).prefix)
    store.close()


@pytest.mark.parametrize(("key", "value"), CASES, ids=[f"{k}={v[:20]}" for k, v in CASES])
def test_a_bad_key_marks_its_own_job_and_nothing_else(two_jobs, key: str, value: str) -> None:
    store, controllers = two_jobs
    victim_keys = JobKeys("default", "victim")
    budget_before = store.get(victim_keys.budget).value
    store.put(victim_keys.prefix + key, value)

    if key == "workers/w1":  # read when the local WorkerSet adopts: a bad record is skipped, not fatal
        victim = controllers["victim"].workers
        LocalProcesses(store, victim_keys, victim.log_dir, victim.checkpoint_dir)
        return
    if key == "status":  # the controller's own derived output: read as absent, rewritten, never fatal
        again = controllers["victim"]
        assert JobController(store, again.job, again.workers, again.endpoints).status == {}
        return
    status = controllers["victim"].step()
    condition = next(c for c in status["conditions"] if c["type"] == CORRUPT_STATE)
    assert condition["status"] == "True"
    assert victim_keys.prefix + key in condition["message"]
    assert "Traceback" not in condition["message"]
    assert controllers["victim"].workers.pids() == {}  # no action taken on a state that does not decode
    if key != "budget":
        assert store.get(victim_keys.budget).value == budget_before  # never charged
    if key != "progress":  # what an agent would fail its rendezvous with names the key
        error = JobRun(store, victim_keys).read().corruption()
        assert error is not None and error.key == victim_keys.prefix + key

    bystander = JobRun(store, JobKeys("default", "bystander")).read()
    assert bystander.corrupt == {} and bystander.spec is not None
    assert "default/bystander" in {j.key for j in list_jobs(store)}


def test_restoring_a_good_value_after_an_absurd_round_resumes_the_job(two_jobs) -> None:
    store, controllers = two_jobs
    keys = JobKeys("default", "victim")
    good = store.get(keys.round).value
    store.put(keys.round, '{"round":100000000000000000000000000}')
    status = controllers["victim"].step()
    assert any(c["type"] == CORRUPT_STATE and c["status"] == "True" for c in status["conditions"]), status
    store.put(keys.round, good)
    status = controllers["victim"].step()
    assert not any(c["type"] == CORRUPT_STATE and c["status"] == "True" for c in status["conditions"]), status
    assert JobRun(store, keys).read().corrupt == {}
