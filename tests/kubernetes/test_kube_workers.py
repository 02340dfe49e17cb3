"""The Kubernetes backend (KubernetesWorkers + KubeStatus) driven by the real JobController and real etcd.

THIS IS A FAKE API SERVER, not a cluster: no kube-apiserver, scheduler or kubelet can run on these
machines. `fake_api.FakeApiServer` serves, on 127.0.0.1, exactly the API paths the controller uses (pods,
events, elasticjobs with their status and scale subresources) and the tests talk to it through the real
`kubernetes` Python client, so request paths, query parameters (labelSelector, gracePeriodSeconds), patch
content types and (de)serialisation are the client's own. The tests play the kubelet: they set pod phases,
exit codes and reasons (OOMKilled, Evicted, DisruptionTarget) in the fake's store directly.

What these tests check: the pod each worker gets (image, `python` command, env, labels, owner reference,
restartPolicy Never), the mapping of pod states to worker exits, the same reconcile scenarios as the local
backend (exit 137 -> one charge and a replacement pod; OOMKilled with a FailJob rule -> Failed and pods
deleted; Evicted with an Ignore rule -> no charge, replaced; success -> pods deleted), the status
subresource and Events, and that every request stays within manifests/rbac.yaml.

What a real-cluster test (kind, k3d or a cloud cluster) would add: scheduling and image pulls, the exit
codes and reasons a real kubelet reports (and their timing: graceful deletion, SIGTERM then SIGKILL after
the grace period), real evictions, preemptions and node loss, garbage collection through the owner
reference, CRD schema validation and defaulting by the API server, and RBAC enforced by the API server
rather than compared with the manifest.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import pytest
from fake_api import FakeApiServer
from kube_harness import _until, job_doc
from kubernetes import client
from kubernetes.client import ApiException

from elastic.cluster.base import WorkerLaunch, WorkerStartError
from elastic.cluster.kubernetes import KubernetesWorkers
from elastic.cluster.pod_manifest import pod_manifest
from elastic.cluster.pod_status import exit_reason, observe_pod
from elastic.rendezvous.state import Closed
from elastic.spec import parse_job


def pod(phase: str, code: int | None = None, container_reason: str | None = None, **status: Any) -> dict[str, Any]:
    pod_status: dict[str, Any] = {"phase": phase, **status}
    if code is not None:
        terminated = {"exitCode": code, "reason": container_reason or "Error"}
        pod_status["containerStatuses"] = [{"name": "worker", "state": {"terminated": terminated}}]
    meta = {"name": "j-1", "labels": {"elastic.dev/worker": "j-1"}, "creationTimestamp": "2026-01-01T00:00:00Z"}
    return {"metadata": meta, "status": pod_status}


DISRUPTION = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
TAINT = {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}


@pytest.mark.parametrize(
    ("pod_json", "alive", "code", "reason"),
    [
        (pod("Pending"), True, None, None),
        (pod("Running"), True, None, None),
        (pod("Succeeded", 0, "Completed"), False, 0, None),
        (pod("Failed", 137), False, 137, None),
        (pod("Failed", 137, "OOMKilled"), False, 137, "OOMKilled"),
        (pod("Failed", 137, reason="Evicted", conditions=[DISRUPTION]), False, 137, "Evicted"),
        (pod("Failed", 143, conditions=[DISRUPTION]), False, 143, "DisruptionTarget"),
        (pod("Failed", 137, conditions=[TAINT]), False, 137, "NodeLost"),
        (pod("Failed", reason="NodeLost"), False, None, "NodeLost"),
        (pod("Failed", reason="UnexpectedAdmissionError"), False, None, "NodeLost"),
        (pod("Unknown"), False, None, "NodeLost"),
    ],
)
def test_pod_states_map_to_worker_exits(pod_json: dict, alive: bool, code: int | None, reason: str | None) -> None:
    seen = observe_pod(pod_json, stopping=False)
    assert (seen.name, seen.alive, seen.exit_code, seen.reason) == ("j-1", alive, code, reason)
    assert seen.started_at > 0
    if not alive:
        assert exit_reason(pod_json) == reason


def test_the_pod_of_a_worker(fake: FakeApiServer, core: client.CoreV1Api) -> None:
    stored = fake.add_job(job_doc("pj"))
    job = parse_job({**job_doc("pj"), "metadata": {"name": "pj", "uid": stored["metadata"]["uid"]}})
    launch = WorkerLaunch(
        "pj-00aa", [sys.executable, "-m", "elastic.agent", "--local-addr=127.0.0.1", "--no-python",
                    sys.executable, "train.py"], {"ELASTIC_ETCD_ENDPOINTS": "http://etcd:2379"})  # fmt: skip
    KubernetesWorkers(core, job).start(launch)
    created = fake.pods[("default", "pj-00aa")]
    assert created == {**pod_manifest(job, "default", launch, 1), **{k: created[k] for k in ("metadata", "status")}}
    container = created["spec"]["containers"][0]
    assert created["spec"]["restartPolicy"] == "Never"
    assert container["name"] == "worker" and container["image"] == "example/train:1"
    assert container["command"] == ["python", "-m", "elastic.agent", "--local-addr=$(POD_IP)", "--no-python",
                                    "python", "train.py"]  # fmt: skip
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ELASTIC_WORKER"] == "pj-00aa" and env["ELASTIC_ETCD_ENDPOINTS"] == "http://etcd:2379"
    assert container["resources"] == {"limits": {"cpu": "2", "memory": "4Gi"}}
    assert created["metadata"]["labels"] == {
        "elastic.dev/job": "pj", "elastic.dev/worker": "pj-00aa", "elastic.dev/incarnation": "1"}  # fmt: skip
    assert created["metadata"]["ownerReferences"] == [
        {"apiVersion": "elastic.dev/v1alpha1", "kind": "ElasticJob", "name": "pj", "uid": stored["metadata"]["uid"],
         "controller": True, "blockOwnerDeletion": True}]  # fmt: skip
    # A second controller (restarted, or the new leader) adopts the pod and carries the incarnation on.
    adopted = KubernetesWorkers(core, job)
    assert [w.name for w in adopted.observe()] == ["pj-00aa"]
    adopted.start(WorkerLaunch("pj-00bb", [sys.executable, "x.py"], {}))
    assert fake.pods[("default", "pj-00bb")]["metadata"]["labels"]["elastic.dev/incarnation"] == "2"


def test_a_pod_gone_without_being_asked_is_a_lost_node(fake: FakeApiServer, core: client.CoreV1Api) -> None:
    fake.add_job(job_doc("gj"))
    workers = KubernetesWorkers(core, parse_job(job_doc("gj")))
    workers.start(WorkerLaunch("gj-0001", ["python", "x.py"], {}))
    workers.start(WorkerLaunch("gj-0002", ["python", "x.py"], {}))
    fake.vanish("gj-0001")  # the node and its pods vanished
    workers.stop("gj-0002")
    seen = {w.name: w for w in workers.observe()}
    assert (seen["gj-0001"].alive, seen["gj-0001"].reason, seen["gj-0001"].stopping) == (False, "NodeLost", False)
    assert (seen["gj-0002"].alive, seen["gj-0002"].reason, seen["gj-0002"].stopping) == (False, None, True)
    assert fake.deletions == [("gj-0002", 15)]


def test_a_preempted_pod_is_a_failure_to_classify_not_a_stop(fake: FakeApiServer, core: client.CoreV1Api) -> None:
    fake.add_job(job_doc("rj"))
    workers = KubernetesWorkers(core, parse_job(job_doc("rj")))
    workers.start(WorkerLaunch("rj-0001", ["python", "x.py"], {}))
    preempting = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    fake.set_pod("rj-0001", "Running", conditions=[preempting])
    with fake.lock:
        fake.pods[("default", "rj-0001")]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    adopted = KubernetesWorkers(core, parse_job(job_doc("rj")))  # a controller restarted meanwhile
    for seen in (workers.observe()[0], adopted.observe()[0]):
        assert (seen.alive, seen.stopping) == (True, False)
    fake.set_pod("rj-0001", "Failed", 143, conditions=[preempting])
    for seen in (workers.observe()[0], adopted.observe()[0]):
        assert (seen.alive, seen.exit_code, seen.reason, seen.stopping) == (False, 143, "DisruptionTarget", False)


def test_a_pod_failing_with_137_costs_one_charge_and_is_replaced(harness) -> None:
    h = harness()
    first, second = h.start_training()
    h.fake.set_pod(second, "Failed", 137)
    status = h.step()
    assert h.budget()["used"] == 1
    assert status["restarts"] == {"used": 1, "max": 3} and status["phase"] == "Restarting"
    assert status["lastFailure"]["exitCode"] == 137
    pods = h.pods()
    assert first in pods and second not in pods and len(pods) == 2
    assert (second, 0) in h.fake.deletions
    h.step()  # level-triggered: nothing more is charged or started
    assert h.budget()["used"] == 1 and len(h.pods()) == 2
    # (e) the status subresource, the scale subresource and the story in Events
    kube = h.kube_job()
    assert kube["status"]["phase"] == "Restarting" and kube["status"]["restartsText"] == "1/3"
    assert kube["status"]["selector"] == f"elastic.dev/job={h.name}"
    assert kube["spec"]["replicas"] == 2  # the status subresource leaves the spec alone
    # the replacement pod is Pending: only Ready pods are active (what an HPA reads from /scale)
    scale = h.user.get_namespaced_custom_object_scale("elastic.dev", "v1alpha1", "default", "elasticjobs", h.name)
    assert scale["status"] == {"replicas": 1, "selector": f"elastic.dev/job={h.name}"}
    assert h.reasons() == ["Gathering", "RoundSealed", "Restarted", "WorkerExited"]
    restarted = h.fake.events_for(h.name)[2]
    assert restarted["type"] == "Warning" and "exit code 137" in restarted["message"] and "1/3" in restarted["message"]
    assert restarted["involvedObject"]["uid"] == h.job.metadata.uid
    # status: a merge patch; a pod's finalizer: a JSON patch (a strategic merge patch would add to finalizers)
    assert set(h.fake.patch_types) <= {"application/merge-patch+json", "application/json-patch+json"}


def test_oom_killed_with_a_fail_job_rule_fails_the_job_and_deletes_its_pods(harness) -> None:
    h = harness(failurePolicy={"maxRestarts": 3, "rules": [{"action": "FailJob", "onReasons": ["OOMKilled"]}]})
    _, second = h.start_training()
    h.fake.set_pod(second, "Failed", 137, container_reason="OOMKilled")
    status = h.until_done()
    assert status["phase"] == "Failed" and "OOMKilled" in status["message"]
    assert h.controller.run.read().closed is not None
    h.workers.finish()  # what the manager does once the job is done: no pod, no finalizer of ours left
    assert h.pods() == [] and h.budget()["used"] == 0
    assert h.kube_job()["status"]["phase"] == "Failed"
    failed = h.fake.events_for(h.name)[-1]
    assert failed["type"] == "Warning" and failed["reason"] == status["reason"] and "Restarted" not in h.reasons()


def test_an_evicted_pod_with_an_ignore_rule_costs_nothing_and_is_replaced(harness) -> None:
    h = harness(failurePolicy={"maxRestarts": 3, "rules": [{"action": "Ignore", "onReasons": ["Evicted"]}]})
    first, second = h.start_training()
    evicted = {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}
    h.fake.set_pod(second, "Failed", 137, reason="Evicted", conditions=[evicted])
    status = h.step()
    assert h.budget()["used"] == 0 and status["restarts"]["used"] == 0
    assert h.controller.run.read().round.number == 1  # the round ended (re-rendezvous), without a charge
    pods = h.pods()
    assert first in pods and second not in pods and len(pods) == 2
    assert "Restarted" not in h.reasons()


def test_success_deletes_the_pods(harness) -> None:
    h = harness()
    first, second = h.start_training()
    h.fake.set_pod(first, "Succeeded", 0)
    state = h.controller.run.read()
    h.controller.run.close(state, Closed("Succeeded", "all workers finished", time.time()))
    status = h.until_done()
    assert status["phase"] == "Succeeded"
    assert (second, 15) in h.fake.deletions  # the one still running is stopped gracefully
    h.workers.finish()  # the job is done: what is left (the succeeded pod) goes
    assert h.pods() == [] and (first, 0) in h.fake.deletions
    assert h.kube_job()["status"]["phase"] == "Succeeded" and h.reasons()[-1] == "Succeeded"


def test_the_status_written_survives_the_api_servers_pruning(harness) -> None:
    """Structural pruning drops what the CRD does not declare: every field the controller writes is declared."""
    h = harness()
    _, second = h.start_training()
    h.store.put_json(h.keys.progress, {"step": 7, "loss": 0.25, "world_size": 2})
    h.fake.set_pod(second, "Failed", 137)
    written = h.step()
    assert written["lastFailure"]["cause"] and written["progress"]["step"] == 7
    h.kube_status.publish(written, generation=1)
    stored = h.kube_job()["status"]
    assert stored == {**written, "selector": f"elastic.dev/job={h.name}", "observedGeneration": 1}


def test_a_job_name_at_the_length_limit_gives_pods_the_api_server_accepts(fake, core) -> None:
    longest = "a" * 58  # metadata.name's limit: a worker is '<job>-<4 hex>' and that is a label value too
    fake.add_job(job_doc(longest))
    KubernetesWorkers(core, parse_job(job_doc(longest))).start(WorkerLaunch(f"{longest}-ffff", ["python"], {}))
    assert (longest + "-ffff") in fake.pods_of(longest)
    with pytest.raises(WorkerStartError) as refused:  # one character more: the pod is refused (422), the job's failure
        KubernetesWorkers(core, parse_job(job_doc(longest))).start(WorkerLaunch(f"{longest}b-ffff", ["python"], {}))
    assert "the API server refused its pod" in str(refused.value) and "63 characters" in str(refused.value)


def test_an_evicted_pod_is_seen_as_a_disruption_and_is_free(harness) -> None:
    """An API eviction deletes the pod; the tracking finalizer keeps it until its end was seen (not NodeLost)."""
    h = harness()
    first, second = h.start_training()
    h.fake.disrupt(second, "EvictionByEvictionAPI")
    _until(lambda: h.fake.pods[("default", second)]["status"]["phase"] == "Failed")  # the kubelet stopped it
    status = h.step()
    assert h.budget()["used"] == 0 and status["restarts"]["used"] == 0, h.budget()
    assert h.controller.run.read().round.number == 1  # the round ended, for free
    _until(lambda: second not in h.pods())  # handled: finalizer off, pod gone
    assert first in h.pods() and len(h.pods()) == 2  # and replaced


def test_a_pod_that_ends_and_vanishes_at_once_keeps_its_exit_code(harness) -> None:
    h = harness()
    _, second = h.start_training()
    h.fake.end_and_vanish(second, 137)  # deleted right after it ended, before any poll could see it end
    h.step()
    (charge,) = h.budget()["charges"]
    assert charge["exit_code"] == 137 and charge["reason"] not in ("NodeLost", "MemberLost"), charge


def test_a_pod_on_a_lost_node_is_not_force_deleted(harness) -> None:
    h = harness()
    h.start_training()
    lost = h.fake.partition("node-1")
    h.step()
    assert h.budget()["used"] == 1  # a node that stopped reporting is a real loss
    for name in lost:
        assert (name, 0) not in h.fake.deletions, "its container may still run: only a graceful delete"
        assert h.fake.pods[("default", name)]["metadata"]["deletionTimestamp"]


def test_worker_pods_get_no_token_and_a_locked_down_container(fake, core) -> None:
    fake.add_job(job_doc("sj"))
    KubernetesWorkers(core, parse_job(job_doc("sj"))).start(WorkerLaunch("sj-0001", ["python"], {}))
    spec = fake.pods[("default", "sj-0001")]["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


WAITING = [
    pytest.param({"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                  "message": "0/3 nodes are available"}]},
                 "Unschedulable: 0/3 nodes are available", id="no node fits"),
    pytest.param({"containerStatuses": [{"name": "worker", "state": {"waiting": {
        "reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]},
                 "ImagePullBackOff: Back-off pulling image", id="the image does not pull"),
    pytest.param({"initContainerStatuses": [{"name": "setup", "state": {"waiting": {
        "reason": "CreateContainerConfigError", "message": 'secret "s" not found'}}}]},
                 'CreateContainerConfigError: secret "s" not found', id="an init container's config is missing"),
    pytest.param({"containerStatuses": [{"name": "worker", "state": {"waiting": {"reason": "ContainerCreating"}}}]},
                 None, id="creating is not stuck"),
]  # fmt: skip


@pytest.mark.parametrize(("status", "expected"), WAITING)
def test_why_a_pending_pod_does_not_run(status: dict, expected: str | None) -> None:
    seen = observe_pod(pod("Pending", **status), stopping=False)
    assert (seen.alive, seen.ready, seen.waiting) == (True, False, expected)


def test_a_stuck_pod_is_a_condition_and_an_event_and_not_active(harness) -> None:
    h = harness()
    h.step()
    h.step()
    first, second = h.pods()
    h.fake.set_pod(first, "Running")
    h.fake.set_pod(second, "Pending", waiting="ImagePullBackOff")
    status = h.step()
    (waiting,) = [c for c in status["conditions"] if c["type"] == "WorkersWaiting"]
    assert waiting["status"] == "True" and waiting["reason"] == "ImagePullBackOff" and second in waiting["message"]
    assert status["replicas"]["active"] == 1  # only the Ready pod
    assert "ImagePullBackOff" in h.reasons()
    h.fake.set_pod(second, "Running")
    (waiting,) = [c for c in h.step()["conditions"] if c["type"] == "WorkersWaiting"]
    assert waiting["status"] == "False"


def test_a_recreated_job_does_not_adopt_the_old_jobs_pods(fake, core) -> None:
    old = fake.add_job(job_doc("rc"))
    old_job = parse_job({**job_doc("rc"), "metadata": {"name": "rc", "uid": old["metadata"]["uid"]}})
    KubernetesWorkers(core, old_job).start(WorkerLaunch("rc-0001", ["python"], {}))
    fake.run_pod("rc-0001")
    with fake.lock:  # deleted and re-created under the same name while the old pod still terminates
        del fake.jobs[("default", "rc")]
    new = fake.add_job(job_doc("rc"))
    new_job = parse_job({**job_doc("rc"), "metadata": {"name": "rc", "uid": new["metadata"]["uid"]}})
    assert KubernetesWorkers(core, new_job).observe() == []
    assert [w.name for w in KubernetesWorkers(core, old_job).observe()] == ["rc-0001"]


def test_a_second_create_of_a_name_is_a_conflict_and_the_pod_is_one_worker(fake, core) -> None:
    """Issue 23: this 409 was adopted as "a create that went through before a lost answer"; it cannot be
    told from a live pod that drew the same 16-bit suffix, which adoption would count twice."""
    stored = fake.add_job(job_doc("cr"))
    job = parse_job({**job_doc("cr"), "metadata": {"name": "cr", "uid": stored["metadata"]["uid"]}})
    KubernetesWorkers(core, job).start(WorkerLaunch("cr-0001", ["python"], {}))
    again = KubernetesWorkers(core, job)  # a restarted controller; it lists the pod
    with pytest.raises(ApiException) as conflict:
        again.start(WorkerLaunch("cr-0001", ["python"], {}))
    assert conflict.value.status == 409
    assert [w.name for w in again.observe()] == ["cr-0001"]


SECURED = {"ELASTIC_ETCD_CACERT": "/controller/ca.crt", "ELASTIC_ETCD_USER": "elastic",
           "ELASTIC_ETCD_PASSWORD": "s3cret", "ELASTIC_ETCD_ENDPOINTS": "https://etcd:2379"}  # fmt: skip


def test_the_controllers_etcd_credentials_never_go_into_a_pod_object(fake, core) -> None:
    fake.add_job(job_doc("tj"))
    workers = KubernetesWorkers(core, parse_job(job_doc("tj")), etcd_secret="elastic-etcd-worker")
    workers.start(WorkerLaunch("tj-0001", ["python"], dict(SECURED)))
    pod = fake.pods[("default", "tj-0001")]
    assert "s3cret" not in json.dumps(pod) and "/controller/ca.crt" not in json.dumps(pod)
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["ELASTIC_ETCD_CACERT"]["value"] == "/etc/elastic/etcd/ca.crt"
    assert env["ELASTIC_ETCD_PASSWORD"]["valueFrom"] == {"secretKeyRef": {"name": "elastic-etcd-worker",
                                                                          "key": "password"}}  # fmt: skip
    assert env["ELASTIC_ETCD_ENDPOINTS"]["value"] == "https://etcd:2379"
    assert {"name": "elastic-etcd", "secret": {"secretName": "elastic-etcd-worker"}} in pod["spec"]["volumes"]
    assert {"name": "elastic-etcd", "mountPath": "/etc/elastic/etcd", "readOnly": True} in container["volumeMounts"]


def test_a_secured_etcd_without_a_worker_secret_is_a_clear_start_failure(fake, core) -> None:
    fake.add_job(job_doc("uj"))
    workers = KubernetesWorkers(core, parse_job(job_doc("uj")))
    with pytest.raises(WorkerStartError, match="ELASTIC_WORKER_ETCD_SECRET"):
        workers.start(WorkerLaunch("uj-0001", ["python"], dict(SECURED)))
    assert fake.pods_of("uj") == {}


def test_a_name_drawn_twice_is_a_conflict_not_an_adoption_of_the_live_pod(fake: FakeApiServer,
                                                                          core: client.CoreV1Api) -> None:  # fmt: skip
    """A worker's suffix has 16 bits: a name can come up again while its first pod lives. Taking that pod
    for the new worker would count one pod as two workers; the create fails (409) and the job retries."""
    stored = fake.add_job(job_doc("cj"))
    job = parse_job({**job_doc("cj"), "metadata": {"name": "cj", "uid": stored["metadata"]["uid"]}})
    workers = KubernetesWorkers(core, job)
    workers.start(WorkerLaunch("cj-00aa", ["python", "x.py"], {}))
    fake.set_pod("cj-00aa", "Running")
    with pytest.raises(ApiException) as conflict:
        workers.start(WorkerLaunch("cj-00aa", ["python", "x.py"], {}))
    assert conflict.value.status == 409
    assert [w.name for w in workers.observe()] == ["cj-00aa"]
