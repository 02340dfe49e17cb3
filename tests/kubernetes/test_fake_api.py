"""The fake API server follows the real one's rules (a looser fake hides exactly the bugs a cluster finds).

Each test states one rule of kube-apiserver and checks the fake through the real `kubernetes` client.
"""

from __future__ import annotations

import copy
import json
import random
import time
from typing import Any

import pytest
import urllib3
from fake_api import Fault, RandomFaults
from kubernetes import client, watch
from kubernetes.client import ApiException

G, V, P = "elastic.dev", "v1alpha1", "elasticjobs"
JOB = {
    "apiVersion": "elastic.dev/v1alpha1",
    "kind": "ElasticJob",
    "metadata": {"name": "j", "namespace": "default"},
    "spec": {"minReplicas": 1, "maxReplicas": 2, "replicas": 2,
             "worker": {"command": ["python", "t.py"], "image": "i"}},
}


def job(**spec: Any) -> dict[str, Any]:
    document = copy.deepcopy(JOB)
    document["spec"].update(spec)
    return document


@pytest.fixture
def admin(admin_client: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(admin_client)


@pytest.fixture
def admin_core(admin_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(admin_client)


def status_of(err: pytest.ExceptionInfo[ApiException]) -> int:
    return err.value.status


def test_resource_versions_are_global_and_generation_counts_spec_changes(fake, admin) -> None:
    created = admin.create_namespaced_custom_object(G, V, "default", P, job())
    assert created["metadata"]["generation"] == 1
    labelled = admin.patch_namespaced_custom_object(G, V, "default", P, "j", {"metadata": {"labels": {"a": "b"}}})
    assert labelled["metadata"]["generation"] == 1  # metadata is not spec
    assert int(labelled["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    scaled = admin.patch_namespaced_custom_object(G, V, "default", P, "j", {"spec": {"replicas": 1}})
    assert scaled["metadata"]["generation"] == 2


def test_a_stale_update_is_a_conflict_and_an_update_without_a_version_is_invalid(fake, admin) -> None:
    created = admin.create_namespaced_custom_object(G, V, "default", P, job())
    admin.patch_namespaced_custom_object(G, V, "default", P, "j", {"spec": {"replicas": 1}})
    with pytest.raises(ApiException) as stale:
        admin.replace_namespaced_custom_object(G, V, "default", P, "j", created)
    assert status_of(stale) == 409
    unversioned = copy.deepcopy(created)
    del unversioned["metadata"]["resourceVersion"]
    with pytest.raises(ApiException) as missing:
        admin.replace_namespaced_custom_object(G, V, "default", P, "j", unversioned)
    assert status_of(missing) == 422


def test_the_status_subresource_and_the_main_resource_each_ignore_the_other_half(fake, admin) -> None:
    admin.create_namespaced_custom_object(G, V, "default", P, job())
    both = {"spec": {"replicas": 1}, "status": {"phase": "Running"}}
    after_status = admin.patch_namespaced_custom_object_status(G, V, "default", P, "j", both)
    assert after_status["spec"]["replicas"] == 2 and after_status["status"]["phase"] == "Running"
    after_main = admin.patch_namespaced_custom_object(G, V, "default", P, "j", {**both, "status": {"phase": "Failed"}})
    assert after_main["spec"]["replicas"] == 1 and after_main["status"]["phase"] == "Running"


def test_the_schema_prunes_defaults_validates_and_runs_its_cel_rules(fake, admin) -> None:
    created = admin.create_namespaced_custom_object(G, V, "default", P, job(undeclared=True, nprocPerNode=None))
    assert "undeclared" not in created["spec"], "structural pruning drops what the schema does not declare"
    assert created["spec"]["nprocPerNode"] == 1, "a null non-nullable field with a default gets the default"
    with pytest.raises(ApiException) as invalid:
        admin.create_namespaced_custom_object(G, V, "default", P, {**job(maxReplicas=0), "metadata": {"name": "k"}})
    assert status_of(invalid) == 422 and "spec.maxReplicas" in invalid.value.body
    with pytest.raises(ApiException) as rule:
        admin.create_namespaced_custom_object(G, V, "default", P, {**job(minReplicas=3), "metadata": {"name": "m"}})
    assert status_of(rule) == 422 and "minReplicas must be <= maxReplicas" in rule.value.body


def test_names_and_labels_are_validated(fake, core) -> None:
    with pytest.raises(ApiException) as long_label:
        core.create_namespaced_pod("default", {"metadata": {"name": "p", "labels": {"a": "x" * 64}},
                                               "spec": {"containers": [{"name": "c", "image": "i"}]}})  # fmt: skip
    assert status_of(long_label) == 422
    with pytest.raises(ApiException) as bad_name:
        core.create_namespaced_pod("default", {"metadata": {"name": "Bad_Name"},
                                               "spec": {"containers": [{"name": "c", "image": "i"}]}})  # fmt: skip
    assert status_of(bad_name) == 422
    container = {"containers": [{"name": "c", "image": "i"}]}
    generated = core.create_namespaced_pod("default", {"metadata": {"generateName": "w-"}, "spec": container})
    assert generated.metadata.name.startswith("w-") and len(generated.metadata.name) == 7


def test_scale_of_a_job_without_replicas_is_a_500_until_a_write_sets_them(fake, admin) -> None:
    """apiextensions: GET /scale with spec.replicas absent is a 500 (every HPA reading it fails), a null one
    is pruned by the schema (it would be an accessor error), a scale write sets it, one without it is a 400."""
    admin.create_namespaced_custom_object(G, V, "default", P, job(replicas=None))
    assert "replicas" not in fake.jobs[("default", "j")]["spec"]
    with pytest.raises(ApiException) as unset:
        admin.get_namespaced_custom_object_scale(G, V, "default", P, "j")
    assert status_of(unset) == 500 and "does not exist" in unset.value.body
    with pytest.raises(ApiException) as empty:
        admin.patch_namespaced_custom_object_scale(G, V, "default", P, "j", {"metadata": {"labels": {"a": "b"}}})
    assert status_of(empty) == 400
    scaled = admin.patch_namespaced_custom_object_scale(G, V, "default", P, "j", {"spec": {"replicas": 2}})
    assert scaled["spec"]["replicas"] == 2 and fake.jobs[("default", "j")]["spec"]["replicas"] == 2
    assert admin.get_namespaced_custom_object_scale(G, V, "default", P, "j")["spec"]["replicas"] == 2


def test_finalizers_hold_a_deletion_and_garbage_collection_follows_owners(fake, admin, admin_core) -> None:
    core = admin_core
    owner = admin.create_namespaced_custom_object(G, V, "default", P, job())
    reference = {"apiVersion": "elastic.dev/v1alpha1", "kind": "ElasticJob", "name": "j",
                 "uid": owner["metadata"]["uid"], "controller": True}  # fmt: skip
    core.create_namespaced_pod("default", {"metadata": {"name": "held", "finalizers": ["x/y"], "ownerReferences": [
        reference]}, "spec": {"containers": [{"name": "c", "image": "i"}]}})  # fmt: skip
    core.create_namespaced_pod("default", {"metadata": {"name": "free", "ownerReferences": [reference]},
                                           "spec": {"containers": [{"name": "c", "image": "i"}]}})  # fmt: skip
    fake.delete_job("j")
    assert ("default", "free") not in fake.pods, "a dependent without finalizers goes with its owner"
    held = fake.pods[("default", "held")]
    assert held["metadata"]["deletionTimestamp"], "a finalizer keeps the object, marked for deletion"
    core.patch_namespaced_pod("held", "default", {"metadata": {"finalizers": None}})
    assert ("default", "held") not in fake.pods


def test_a_running_pod_is_deleted_gracefully(fake, core) -> None:
    core.create_namespaced_pod("default", {"metadata": {"name": "r"}, "spec": {"containers": [{"name": "worker",
                                                                                                "image": "i"}]}})
    fake.run_pod("r")
    core.delete_namespaced_pod("r", "default", grace_period_seconds=15)
    assert fake.pods[("default", "r")]["metadata"]["deletionTimestamp"], "still there while it stops"
    deadline = time.monotonic() + 5
    while ("default", "r") in fake.pods and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ("default", "r") not in fake.pods


def test_watch_from_a_version_bookmarks_and_410_after_compaction(fake, core) -> None:
    fake.add_job(job())  # the list's resourceVersion is then not "0" (which means "from now")
    listed = core.list_namespaced_pod("default")
    start = listed.metadata.resource_version
    core.create_namespaced_pod("default", {"metadata": {"name": "a"}, "spec": {"containers": [{"name": "c",
                                                                                                "image": "i"}]}})
    fake.bookmark_seconds = 0.1
    seen = []
    for event in watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=start,
                                      allow_watch_bookmarks=True, timeout_seconds=1):  # fmt: skip
        seen.append(event["type"])
        if "BOOKMARK" in seen:
            break
    assert seen[0] == "ADDED" and "BOOKMARK" in seen
    fake.compact()
    response = core.list_namespaced_pod("default", watch=True, resource_version=start, timeout_seconds=1,
                                        _preload_content=False)  # fmt: skip
    first = json.loads(response.data.splitlines()[0])
    assert first["type"] == "ERROR" and first["object"]["code"] == 410, "a compacted version is Gone: relist"


def test_rbac_and_pod_security_refuse_with_403(fake, core) -> None:
    with pytest.raises(ApiException) as forbidden:
        core.create_namespace({"metadata": {"name": "x"}})
    assert status_of(forbidden) == 404  # not a resource this fake serves (and not one the controller uses)
    with pytest.raises(ApiException) as rbac:
        core.list_namespaced_secret("default")
    assert status_of(rbac) == 404
    fake.restricted_namespaces.add("locked")
    with pytest.raises(ApiException) as psa:
        core.create_namespaced_pod("locked", {"metadata": {"name": "p"},
                                              "spec": {"containers": [{"name": "c", "image": "i"}]}})  # fmt: skip
    assert status_of(psa) == 403 and "violates PodSecurity" in psa.value.body


def test_verbs_outside_the_controllers_role_are_forbidden(fake, custom) -> None:
    fake.add_job(job())
    with pytest.raises(ApiException) as forbidden:
        custom.delete_namespaced_custom_object(G, V, "default", P, "j")
    assert status_of(forbidden) == 403 and ("elastic.dev", "elasticjobs", "delete") in fake.requests


def test_injected_faults_answer_the_next_matching_requests(fake, core) -> None:
    fake.faults.append(Fault(429, times=1, verb="list", resource="pods"))
    with pytest.raises(ApiException) as throttled:
        core.list_namespaced_pod("default")
    assert status_of(throttled) == 429
    assert core.list_namespaced_pod("default").items == []


def test_a_blackholed_server_reads_requests_and_never_answers_them(fake, core, admin_core) -> None:
    """A request with no deadline would wait forever (kubernetes-client/python#1148): only a read timeout
    ends it. The user (admin) still gets through; after `restore()` new requests are answered."""
    fake.blackhole()
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        core.list_namespaced_pod("default", _request_timeout=(1, 0.5))
    assert 0.5 <= time.monotonic() - started < 2
    assert admin_core.list_namespaced_pod("default").items == []
    fake.restore()
    assert core.list_namespaced_pod("default").items == []


def test_a_watch_caught_in_a_blackhole_stays_silent_even_after_it(fake, core) -> None:
    """A half-open watch: no event, no bookmark, no end. Only the client's read timeout notices."""
    fake.bookmark_seconds = 0.1
    stream = watch.Watch().stream(core.list_namespaced_pod, "default", allow_watch_bookmarks=True,
                                  timeout_seconds=30, _request_timeout=(1, 1.5))  # fmt: skip
    core.create_namespaced_pod("default", {"metadata": {"name": "a"}, "spec": {"containers": [{"name": "c",
                                                                                                "image": "i"}]}})
    assert next(stream)["type"] == "ADDED"
    fake.blackhole()
    deadline = time.monotonic() + 5
    while not fake.held:  # the watch is caught
        assert time.monotonic() < deadline
        time.sleep(0.01)
    fake.restore()
    core.create_namespaced_pod("default", {"metadata": {"name": "b"}, "spec": {"containers": [{"name": "c",
                                                                                                "image": "i"}]}})
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):  # pod b's ADDED never comes on this watch
        for _ in stream:
            pass
    assert time.monotonic() - started < 3


def test_a_reset_cuts_a_watch_mid_stream_and_a_restart_makes_old_versions_gone(fake, core) -> None:
    fake.add_job(job())  # the list's resourceVersion is then not "0" (which means "from now")
    start = core.list_namespaced_pod("default").metadata.resource_version
    core.create_namespaced_pod("default", {"metadata": {"name": "a"}, "spec": {"containers": [{"name": "c",
                                                                                                "image": "i"}]}})
    for cut in (fake.reset_connections, fake.restart):
        stream = watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=start,
                                      allow_watch_bookmarks=True, timeout_seconds=30)  # fmt: skip
        assert next(stream)["type"] == "ADDED"
        cut()
        with pytest.raises(urllib3.exceptions.ProtocolError):  # not a clean end of the stream: a broken one
            for _ in stream:
                pass
    response = core.list_namespaced_pod("default", watch=True, resource_version=start, timeout_seconds=1,
                                        _preload_content=False)  # fmt: skip
    first = json.loads(response.data.splitlines()[0])
    assert first["type"] == "ERROR" and first["object"]["code"] == 410, "the restarted cache starts from now"


def test_random_faults_are_seeded_bounded_and_may_lose_the_answer_of_a_write(fake, core) -> None:
    fake.random_faults(seed=7, count=12, probability=0.5)
    outcomes = []
    for n in range(60):
        try:
            core.create_namespaced_pod("default", {"metadata": {"name": f"p{n}"},
                                                   "spec": {"containers": [{"name": "c", "image": "i"}]}})  # fmt: skip
            outcomes.append("ok")
        except ApiException as err:
            outcomes.append(err.status)
        except (urllib3.exceptions.HTTPError, OSError):
            outcomes.append("dropped")
    assert len(fake.injected) == 12 and outcomes.count("ok") == 48
    assert {409, 429, 500, 503} & set(outcomes) and "dropped" in outcomes
    lost = [f"p{n}" for n, outcome in enumerate(outcomes) if outcome == "dropped"]
    if "lost" in fake.injected:
        assert any(("default", name) in fake.pods for name in lost), "a lost answer's create was carried out"
    replay = RandomFaults(random.Random(7), 12, 0.5)  # the same seed, the same faults
    assert [f for f in (replay.draw() for _ in range(60)) if f is not None] == fake.injected
