"""The Kubernetes controller as one replica sees its jobs: informers, the work queue, deletion, isolation.

Against the FAKE API server (tests/kubernetes/fake_api.py: it follows the real one's rules, see its
docstring) through the real `kubernetes` client, and a real etcd. The tests play the user (an admin
client), the kubelet and the scheduler.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fake_api import FakeApiServer, Fault
from kubernetes import client

from elastic.controller.kube_manager import JOB_FINALIZER, KubernetesControllerManager
from elastic.store import JobKeys, Store
from elastic.store.keys import controller_leader_key
from elastic.store.server import EtcdServer
from harness.agents import wait_until


def job_doc(name: str, namespace: str = "team-a", **worker: Any) -> dict[str, Any]:
    return {
        "apiVersion": "elastic.dev/v1alpha1", "kind": "ElasticJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minReplicas": 2, "maxReplicas": 2,
                 "worker": {"command": ["python", "t.py"], "image": "i:1", **worker}},
    }  # fmt: skip


@pytest.fixture
def manager(fake: FakeApiServer, api_client: client.ApiClient, etcd_server: EtcdServer) -> Iterator[Any]:
    with Store(etcd_server.client_url, retry_seconds=5) as store:
        made = KubernetesControllerManager(store, etcd_server.client_url, api_client, "controller-a",
                                           "elastic-system", lease_seconds=2).start()  # fmt: skip
        assert wait_until(made.step, timeout=10), "the single replica leads"
        yield made, store
        made.close()
        store.delete(controller_leader_key("kubernetes"))


def pods_until(fake: FakeApiServer, manager: KubernetesControllerManager, name: str, count: int,
               namespace: str = "team-a") -> list[str]:  # fmt: skip
    assert wait_until(lambda: manager.step(0.1) and len(fake.pods_of(name, namespace)) == count, timeout=10), (
        sorted(fake.pods_of(name, namespace)))
    return sorted(fake.pods_of(name, namespace))


def test_a_pass_makes_no_list_request_once_the_informers_follow(fake, manager) -> None:
    controller, _ = manager
    name = f"w-{uuid.uuid4().hex[:6]}"
    fake.add_job(job_doc(name))
    pods_until(fake, controller, name, 2)
    listed = [r for r in fake.requests if r[2] == "list"]
    for _ in range(20):
        controller.step(0.05)
    assert [r for r in fake.requests if r[2] == "list"] == listed, "every read came from the informers' caches"
    assert ("", "pods", "watch") in fake.requests and ("elastic.dev", "elasticjobs", "watch") in fake.requests


def test_a_compacted_watch_relists_and_the_controller_goes_on(fake, manager) -> None:
    controller, _ = manager
    fake.bookmark_seconds = 3600  # no bookmark may move the pod watch past the change below
    relists = controller.pods.relists
    name = f"c-{uuid.uuid4().hex[:6]}"
    fake.add_job(job_doc(name))  # a change the pod watch has no event for (nor a bookmark yet, within 1 s)...
    fake.compact()  # ...then compaction: the pod informer resumes from a version that is gone
    pods_until(fake, controller, name, 2)
    assert wait_until(lambda: controller.pods.relists > relists, timeout=10), "the 410 made the informer list again"


def test_kubectl_delete_stops_the_pods_removes_the_etcd_keys_and_lets_the_object_go(fake, manager) -> None:
    controller, store = manager
    name = f"d-{uuid.uuid4().hex[:6]}"
    fake.add_job(job_doc(name))
    pods = pods_until(fake, controller, name, 2)
    assert JOB_FINALIZER in fake.jobs[("team-a", name)]["metadata"]["finalizers"]
    for pod in pods:
        fake.set_pod(pod, "Running", namespace="team-a")
    fake.delete_job(name, namespace="team-a")
    assert wait_until(lambda: controller.step(0.1) and ("team-a", name) not in fake.jobs, timeout=10)
    assert store.get_prefix(JobKeys("team-a", name).prefix)[0] == [], "no key of the job is left in etcd"
    assert wait_until(lambda: not fake.pods_of(name, "team-a"), timeout=10), "its pods went with it"


def test_a_clean_up_retried_from_a_stale_object_never_writes_the_job_back_into_etcd(fake, manager) -> None:
    """The finalizer's removal went through but its answer was lost, and the retry read the object from a
    cache that still had the finalizer; once that retry fails too, the object is gone for good and nothing
    would remove a key it had written. (Found by the seeded random faults of test_kube_outage.py.)"""
    controller, store = manager
    name = f"r-{uuid.uuid4().hex[:6]}"
    fake.add_job(job_doc(name))
    pods_until(fake, controller, name, 2)
    stale = json.loads(json.dumps(fake.jobs[("team-a", name)]))
    fake.delete_job(name, namespace="team-a")
    assert wait_until(lambda: controller.step(0.1) and ("team-a", name) not in fake.jobs, timeout=10)
    stale["metadata"]["deletionTimestamp"] = "2026-12-05T00:00:00Z"
    fake.faults.append(Fault(500, times=1, verb="list", resource="pods"))  # the retry fails midway
    with pytest.raises(client.ApiException):
        controller._clean_up(f"team-a/{name}", stale, controller._acting_as)  # the retry, as the queue runs it
    assert store.get_prefix(JobKeys("team-a", name).prefix)[0] == [], "no key of the job is left in etcd"


def test_a_spec_written_into_etcd_never_chooses_what_a_pod_runs(fake, manager) -> None:
    controller, store = manager
    name = f"s-{uuid.uuid4().hex[:6]}"
    fake.add_job(job_doc(name))
    pods_until(fake, controller, name, 2)
    keys = JobKeys("team-a", name)
    forged = json.loads(store.get(keys.spec).value)
    forged["spec"]["worker"]["command"] = ["sh", "-c", "steal-secrets"]
    store.put_json(keys.spec, forged)  # anyone with etcd access
    victim = sorted(fake.pods_of(name, "team-a"))[0]
    fake.set_pod(victim, "Failed", 137, namespace="team-a")  # a replacement pod is made
    assert wait_until(lambda: controller.step(0.1) and victim not in fake.pods_of(name, "team-a")
                      and len(fake.pods_of(name, "team-a")) == 2, timeout=10)  # fmt: skip
    for pod in fake.pods_of(name, "team-a").values():
        assert "steal-secrets" not in json.dumps(pod["spec"]), "the pod runs the ElasticJob object's command"


def test_a_pod_security_refusal_fails_that_job_alone(fake, manager) -> None:
    controller, _ = manager
    fake.restricted_namespaces.add("locked")  # Pod Security `restricted`: our pods (root allowed) are refused
    locked, free = f"l-{uuid.uuid4().hex[:6]}", f"f-{uuid.uuid4().hex[:6]}"
    fake.add_job(job_doc(locked, namespace="locked"))
    fake.add_job(job_doc(free))
    pods_until(fake, controller, free, 2)
    status = lambda: fake.jobs[("locked", locked)].get("status") or {}  # noqa: E731
    assert wait_until(lambda: controller.step(0.1) and status().get("phase") == "Failed", timeout=10)
    assert status()["reason"] == "WorkerStartFailed" and "violates PodSecurity" in status()["message"]
    assert fake.pods_of(locked, "locked") == {} and len(fake.pods_of(free, "team-a")) == 2


def test_a_throttled_job_gets_a_condition_and_an_event_and_is_retried(fake, manager) -> None:
    controller, _ = manager
    name = f"t-{uuid.uuid4().hex[:6]}"
    fake.faults.append(Fault(429, times=2, verb="create", resource="pods"))  # the API server sheds load
    fake.add_job(job_doc(name))

    def condition() -> dict[str, Any]:
        conditions = (fake.jobs[("team-a", name)].get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "ReconcileError"), {})

    assert wait_until(lambda: controller.step(0.1) and condition().get("reason") == "TooManyRequests", timeout=10)
    assert any(e["reason"] == "TooManyRequests" and e["type"] == "Warning" for e in fake.events_for(name))
    pods_until(fake, controller, name, 2)  # retried after its backoff, and through
    assert wait_until(lambda: controller.step(0.1) and not condition(), timeout=10), "cleared once it went through"


def test_the_health_endpoints_answer_the_kubelets_probes() -> None:
    import urllib.error
    import urllib.request

    from elastic.controller.kube_manager import serve_health
    from elastic.store.server import free_port

    ready: list[bool] = [False]
    problem: list[str | None] = [None]
    port = free_port()
    server = serve_health(port, lambda: ready[0], lambda: problem[0])
    try:
        def status(path: str) -> int:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                    return response.status
            except urllib.error.HTTPError as err:
                return err.code

        assert (status("/healthz"), status("/readyz"), status("/metrics")) == (200, 503, 404)
        ready[0] = True  # the informers' first lists are in
        assert status("/readyz") == 200
        problem[0] = "no answer to list_pod_for_all_namespaces (list or watch) for 200 s"  # a frozen cache
        assert status("/healthz") == 503
    finally:
        server.shutdown()
        server.server_close()


def test_the_kubernetes_controller_records_its_jobs_metrics(fake, api_client, etcd_server) -> None:
    from prometheus_client import CollectorRegistry

    from elastic.controller.metrics_export import ControllerMetrics

    metrics = ControllerMetrics(CollectorRegistry())
    with Store(etcd_server.client_url, retry_seconds=5) as store:
        manager = KubernetesControllerManager(store, etcd_server.client_url, api_client, "controller-m",
                                              "elastic-system", lease_seconds=2, metrics=metrics).start()  # fmt: skip
        try:
            name = f"m-{uuid.uuid4().hex[:6]}"
            fake.add_job(job_doc(name))
            pods_until(fake, manager, name, 2)
            labels = {"job_namespace": "team-a", "job_name": name}
            assert metrics.registry.get_sample_value("elastic_replicas_desired", labels) == 2
            assert metrics.registry.get_sample_value("elastic_rounds_total", labels) == 1
        finally:
            manager.close()
            store.delete(controller_leader_key("kubernetes"))


def test_a_job_without_replicas_gets_them_once_so_an_hpa_can_read_and_write_its_scale(
    fake, manager, admin_client
) -> None:
    """GET /scale is a 500 on a job whose spec.replicas is unset (apiextensions): the controller writes the
    value unset means (maxReplicas) once; the HPA then reads the scale (replicas, selector) and writes it."""
    controller, _ = manager
    user = client.CustomObjectsApi(admin_client)  # the HPA controller's own rights on */scale
    name = f"h-{uuid.uuid4().hex[:6]}"
    fake.add_job({**job_doc(name), "spec": {**job_doc(name)["spec"], "minReplicas": 1, "maxReplicas": 3}})
    pods_until(fake, controller, name, 3)
    assert fake.jobs[("team-a", name)]["spec"]["replicas"] == 3, "the value unset means, written once"

    def scale() -> dict[str, Any]:
        return user.get_namespaced_custom_object_scale("elastic.dev", "v1alpha1", "team-a", "elasticjobs", name)

    assert wait_until(lambda: controller.step(0.1) and scale()["status"]["selector"], timeout=10)
    assert scale()["spec"]["replicas"] == 3 and scale()["status"]["selector"] == f"elastic.dev/job={name}"
    user.patch_namespaced_custom_object_scale("elastic.dev", "v1alpha1", "team-a", "elasticjobs", name,
                                              {"spec": {"replicas": 1}})  # the HPA scales down  # fmt: skip
    pods_until(fake, controller, name, 1)
    assert scale()["spec"]["replicas"] == 1


@pytest.mark.parametrize("ended", ["deleted while no controller ran", "finished before its pods were released"])
def test_tracking_finalizers_left_by_a_controller_that_went_are_released_by_the_next(
    fake, api_client, etcd_server, ended: str
) -> None:
    """Without a sweep, pods whose job nobody runs any more keep the tracking finalizer: Terminating forever."""
    name = f"f-{uuid.uuid4().hex[:6]}"
    with Store(etcd_server.client_url, retry_seconds=5) as store:
        first = KubernetesControllerManager(store, etcd_server.client_url, api_client, "controller-1",
                                            "elastic-system", lease_seconds=2).start()  # fmt: skip
        assert wait_until(first.step, timeout=10)
        fake.add_job(job_doc(name))
        pods = pods_until(fake, first, name, 2)
        first.close()  # the controller goes (uninstalled, or down)
        store.delete(controller_leader_key("kubernetes"))
        for pod in pods:
            fake.set_pod(pod, "Succeeded", exit_code=0, namespace="team-a")
        if ended == "deleted while no controller ran":  # kubectl delete, then its finalizer taken off by hand
            fake.delete_job(name, "team-a")
            with fake.lock:
                job = fake.jobs[("team-a", name)]
                fake._write("elastic.dev", "elasticjobs", "team-a", name,
                            {**job, "metadata": {**job["metadata"], "finalizers": []}}, None)  # fmt: skip
        else:  # its final status was written, and the controller went before releasing its pods
            with fake.lock:
                job = fake.jobs[("team-a", name)]
                final = {**job, "status": {**(job.get("status") or {}), "phase": "Succeeded"}}
                fake._write("elastic.dev", "elasticjobs", "team-a", name, final, "status")
        assert all("elastic.dev/worker-tracking" in fake.pods[("team-a", p)]["metadata"]["finalizers"] for p in pods)
        second = KubernetesControllerManager(store, etcd_server.client_url, api_client, "controller-2",
                                             "elastic-system", lease_seconds=2).start()  # fmt: skip
        try:

            def released() -> bool:
                second.step(0.1)
                with fake.lock:
                    left = [fake.pods.get(("team-a", p)) for p in pods]
                return all(pod is None or not pod["metadata"].get("finalizers") for pod in left)

            assert wait_until(released, timeout=10), [fake.pods.get(("team-a", p)) for p in pods]
        finally:
            second.close()
            store.delete(controller_leader_key("kubernetes"))


def test_the_informers_keep_no_managed_fields(fake, manager) -> None:
    """managedFields are often most of an object's metadata, and nothing the controller reads."""
    controller, _ = manager
    name = f"mf-{uuid.uuid4().hex[:6]}"
    fake.add_job(job_doc(name))
    pods = pods_until(fake, controller, name, 2)
    assert all(fake.pods[("team-a", p)]["metadata"].get("managedFields") for p in pods), "the server keeps them"
    cached = [*controller.pods.indexed(("team-a", name)), controller.jobs.get("team-a", name)]
    assert len(cached) == 3 and not any("managedFields" in obj["metadata"] for obj in cached)


def test_a_pod_disruption_budget_keeps_min_replicas_through_a_drain(fake, manager, admin_client) -> None:
    """spec.podDisruptionBudget: evictions (a drain) take the job down to minReplicas ready pods, no further;
    turning the flag off removes the budget."""
    controller, _ = manager
    user = client.CoreV1Api(admin_client)
    name = f"b-{uuid.uuid4().hex[:6]}"
    doc = job_doc(name)
    fake.add_job({**doc, "spec": {**doc["spec"], "minReplicas": 2, "maxReplicas": 3, "podDisruptionBudget": True}})
    pods = pods_until(fake, controller, name, 3)
    budget = fake.objects[("policy", "poddisruptionbudgets")][("team-a", name)]
    assert budget["spec"] == {"minAvailable": 2, "selector": {"matchLabels": {"elastic.dev/job": name}}}
    assert budget["metadata"]["ownerReferences"][0]["uid"] == fake.jobs[("team-a", name)]["metadata"]["uid"]
    for pod in pods:
        fake.set_pod(pod, "Running", namespace="team-a")

    def evict(pod: str) -> int:
        try:
            user.create_namespaced_pod_eviction(pod, "team-a", {"metadata": {"name": pod, "namespace": "team-a"}})
            return 201
        except client.ApiException as err:
            return err.status

    assert [evict(pods[0]), evict(pods[1])] == [201, 429], "the second would leave 1 < minReplicas ready"
    with fake.lock:
        job = fake.jobs[("team-a", name)]
        fake._write("elastic.dev", "elasticjobs", "team-a", name,
                    {**job, "spec": {**job["spec"], "podDisruptionBudget": False}}, None)  # fmt: skip
    assert wait_until(lambda: controller.step(0.1) and ("team-a", name) not in fake.objects[
        ("policy", "poddisruptionbudgets")], timeout=10)  # fmt: skip


def test_nothing_polls_a_job_nothing_happened_to(fake, manager) -> None:
    """A job whose workers run and whose keys stay still is not reconciled again (no periodic requeue): at
    1,000 jobs a requeue every few seconds per job is hundreds of reconciles a second doing nothing."""
    controller, _ = manager
    name = f"q-{uuid.uuid4().hex[:6]}"
    fake.add_job(job_doc(name))
    for pod in pods_until(fake, controller, name, 2):
        fake.run_pod(pod, "team-a")
    key = f"team-a/{name}"
    steps: list[float] = []
    assert wait_until(lambda: controller.step(0.1) and key in controller.controllers, timeout=10)
    job_controller = controller.controllers[key][0]
    original = job_controller.step

    def counted() -> Any:
        steps.append(time.monotonic())
        return original()

    job_controller.step = counted
    settle = time.monotonic() + 3  # the status follows the pods; then nothing more happens to the job
    while time.monotonic() < settle:
        controller.step(0.1)
    quiet_from = time.monotonic()
    while time.monotonic() - quiet_from < 7:  # longer than the 5 s requeue this replaced
        controller.step(0.2)
    assert [t for t in steps if t > quiet_from] == [], f"reconciled {len(steps)} times, last with nothing changed"
    fake.set_pod(sorted(fake.pods_of(name, "team-a"))[0], "Failed", exit_code=1, namespace="team-a")
    assert wait_until(lambda: controller.step(0.1) and any(t > quiet_from for t in steps), timeout=10), (
        "a pod's failure is an event: the job is reconciled at once")


def test_a_deadline_falls_due_with_no_event_and_fails_the_job_at_it(fake, manager) -> None:
    """Nothing changes, yet the job must fail at activeDeadlineSeconds: the controller requeued it for then."""
    controller, _ = manager
    name = f"t-{uuid.uuid4().hex[:6]}"
    doc = job_doc(name)
    doc["spec"]["activeDeadlineSeconds"] = 3
    fake.add_job(doc)
    for pod in pods_until(fake, controller, name, 2):
        fake.run_pod(pod, "team-a")
    status = lambda: fake.jobs[("team-a", name)].get("status") or {}  # noqa: E731
    assert wait_until(lambda: controller.step(0.2) is not None and status().get("reason") == "DeadlineExceeded",
                      timeout=20), status()
