"""spec.worker.template (a PodTemplateSpec), init-container failures and startupTimeoutSeconds on the fake cluster.

The template is the base of every worker pod; the controller overlays what it owns (the worker container's
command, image and env, its labels, owner reference, finalizer, restartPolicy Never) and fills in its
defaults (no service-account token, a locked-down securityContext, a 15 s grace period) only where the
template is silent. THE API SERVER HERE IS A FAKE (see fake_api.py): it validates the ElasticJob against
manifests/crd.yaml and applies the `restricted` Pod Security checks a worker pod can break, nothing more
of a PodSpec.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import kubernetes_validate
import pytest
from fake_api import FakeApiServer
from kube_harness import _until
from kubernetes import client
from test_kube_workers import pod

from elastic.cluster.base import WorkerLaunch, WorkerStartError
from elastic.cluster.kubernetes import KubernetesWorkers
from elastic.cluster.pod_manifest import CONTAINER_SECURITY, pod_manifest
from elastic.cluster.pod_status import exit_reason, observe_pod
from elastic.spec import SpecError, parse_job

K8S_VERSION = "1.31"  # as tests/deploy validates the manifests
SHM = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}
TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "vision"}, "annotations": {"example.com/owner": "alice"}},
    "spec": {
        "serviceAccountName": "trainer",
        "nodeSelector": {"nvidia.com/gpu.product": "H100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "priorityClassName": "training",
        "volumes": [SHM],
        "initContainers": [{"name": "fetch", "image": "busybox", "command": ["sh", "-c", "cp /src/* /data"]}],
        "containers": [
            {
                "name": "worker",
                "image": "example/train:2",
                "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
                "env": [
                    {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
                    {"name": "ELASTIC_WORKER", "value": "mine"},
                ],
                "ports": [{"containerPort": 29500}],
            },
            {"name": "metrics", "image": "example/exporter:1"},
        ],
    },
}


def doc(name: str = "tj", template: dict[str, Any] | None = None, image: str | None = "example/train:1",
        **spec: Any) -> dict[str, Any]:  # fmt: skip
    worker: dict[str, Any] = {"command": ["python", "train.py"]}
    if template is not None:
        worker["template"] = template
    if image is not None:
        worker["image"] = image
    return {
        "apiVersion": "elastic.dev/v1alpha1",
        "kind": "ElasticJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"minReplicas": 2, "maxReplicas": 2, "failurePolicy": {"maxRestarts": 3}, **spec, "worker": worker},
    }


def manifest(template: dict[str, Any] | None = None, **worker: Any) -> dict[str, Any]:
    job_doc = doc(template=template)
    job_doc["spec"]["worker"].update(worker)
    launch = WorkerLaunch("tj-0001", [sys.executable, "train.py"], {"ELASTIC_ETCD_ENDPOINTS": "http://etcd:2379"})
    return pod_manifest(parse_job(job_doc), "default", launch, 1)


def test_the_template_is_the_base_of_every_worker_pod(fake: FakeApiServer, core: client.CoreV1Api) -> None:
    stored = fake.add_job(doc(template=TEMPLATE, image=None))
    assert stored["spec"]["worker"]["template"] == TEMPLATE  # the CRD keeps the PodSpec as written (no pruning)
    uid = stored["metadata"]["uid"]
    job = parse_job({**doc(template=TEMPLATE, image=None), "metadata": {"name": "tj", "uid": uid}})
    KubernetesWorkers(core, job).start(WorkerLaunch("tj-0001", ["python", "train.py"], {"A": "1"}))
    created = fake.pods[("default", "tj-0001")]
    meta, spec = created["metadata"], created["spec"]
    assert meta["labels"] == {"team": "vision", "elastic.dev/job": "tj", "elastic.dev/worker": "tj-0001",
                              "elastic.dev/incarnation": "1"}  # fmt: skip
    assert meta["annotations"] == {"example.com/owner": "alice"}
    assert meta["finalizers"] == ["elastic.dev/worker-tracking"] and meta["ownerReferences"][0]["uid"]
    for key in ("serviceAccountName", "nodeSelector", "tolerations", "priorityClassName", "volumes"):
        assert spec[key] == TEMPLATE["spec"][key], key
    assert spec["restartPolicy"] == "Never"
    worker, metrics = spec["containers"]  # the worker first: `kubectl logs` without -c shows it
    assert (worker["name"], worker["image"], metrics["name"]) == ("worker", "example/train:2", "metrics")
    assert worker["command"] == ["python", "train.py"]
    assert worker["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert worker["ports"] == [{"containerPort": 29500}]
    env = {var["name"]: var for var in worker["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}
    assert env["ELASTIC_WORKER"] == {"name": "ELASTIC_WORKER", "value": "tj-0001"}  # the controller's gives way to none
    assert [var["name"] for var in worker["env"]].count("ELASTIC_WORKER") == 1
    assert env["A"]["value"] == "1" and "POD_IP" in env
    # every container, the init container and the sidecar too, gets the default security context
    (fetch,) = spec["initContainers"]
    for container in (worker, metrics, fetch):
        assert container["securityContext"] == CONTAINER_SECURITY, container["name"]
    assert spec["automountServiceAccountToken"] is False and spec["terminationGracePeriodSeconds"] == 15


def _defaults(pod_json: dict[str, Any]) -> tuple[Any, ...]:
    spec = pod_json["spec"]
    return spec["automountServiceAccountToken"], spec["terminationGracePeriodSeconds"], spec["containers"][0][
        "securityContext"]  # fmt: skip


SECURITY = [
    pytest.param(None, (False, 15, CONTAINER_SECURITY), id="no template: no token, locked-down container, 15 s"),
    pytest.param({"spec": {"volumes": [SHM]}}, (False, 15, CONTAINER_SECURITY),
                 id="a template silent on them keeps every default"),
    pytest.param({"spec": {"automountServiceAccountToken": True, "terminationGracePeriodSeconds": 120}},
                 (True, 120, CONTAINER_SECURITY), id="a template wanting the token and time to checkpoint gets them"),
    pytest.param({"spec": {"containers": [{"name": "worker", "securityContext": {"runAsNonRoot": True,
                                                                                   "runAsUser": 1000}}]}},
                 (False, 15, {**CONTAINER_SECURITY, "runAsNonRoot": True, "runAsUser": 1000}),
                 id="the template's container fields are added to the defaults"),
    pytest.param({"spec": {"containers": [{"name": "worker", "securityContext": {"capabilities": {
        "add": ["IPC_LOCK"], "drop": ["ALL"]}}}]}},
                 (False, 15, {**CONTAINER_SECURITY, "capabilities": {"add": ["IPC_LOCK"], "drop": ["ALL"]}}),
                 id="capabilities the template sets are its own, whole (RDMA's IPC_LOCK)"),
    pytest.param({"spec": {"containers": [{"name": "worker", "securityContext": {"privileged": True}}]}},
                 (False, 15, {"privileged": True, "capabilities": {"drop": ["ALL"]},
                              "seccompProfile": {"type": "RuntimeDefault"}}),
                 id="privileged: no allowPrivilegeEscalation false (the API server refuses the pair)"),
    pytest.param({"spec": {"containers": [{"name": "worker", "securityContext": {
        "capabilities": {"add": ["CAP_SYS_ADMIN"]}}}]}},
                 (False, 15, {"capabilities": {"add": ["CAP_SYS_ADMIN"]},
                              "seccompProfile": {"type": "RuntimeDefault"}}),
                 id="an added SYS_ADMIN: no allowPrivilegeEscalation false either"),
    pytest.param({"spec": {"securityContext": {"seccompProfile": {"type": "Localhost",
                                                                   "localhostProfile": "train.json"}}}},
                 (False, 15, {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}),
                 id="a pod seccompProfile is not overridden by a container default"),
    pytest.param({"spec": {"containers": [{"name": "worker", "securityContext": {
        "allowPrivilegeEscalation": True}}]}},
                 (False, 15, {**CONTAINER_SECURITY, "allowPrivilegeEscalation": True}),
                 id="a template that says otherwise wins, key by key"),
]  # fmt: skip


@pytest.mark.parametrize(("template", "expected"), SECURITY)
def test_defaults_fill_only_what_the_template_leaves_unsaid(template: dict | None, expected: tuple) -> None:
    assert _defaults(manifest(copy.deepcopy(template))) == expected


@pytest.mark.parametrize("template", [pytest.param(TEMPLATE, id="every kind of template field"), *(
    pytest.param(case.values[0], id=case.id) for case in SECURITY)])  # fmt: skip
def test_every_pod_built_is_a_valid_pod_for_kubernetes(template: dict | None) -> None:
    """Kubernetes' own Pod schema, strict (no unknown or misspelt field): the fake checks none of it."""
    built = manifest(copy.deepcopy(template), image=None) if template is TEMPLATE else manifest(copy.deepcopy(template))
    kubernetes_validate.validate(built, K8S_VERSION, strict=True)


def test_the_controller_owns_restart_policy_labels_and_the_worker_command() -> None:
    worker_container = {"name": "worker", "workingDir": "/w", "resources": {"limits": {"cpu": "1"}}}
    built = manifest({"metadata": {"labels": {"app": "x"}}, "spec": {"restartPolicy": "Never",
                                                                     "containers": [worker_container]}})  # fmt: skip
    (worker,) = built["spec"]["containers"]
    assert built["spec"]["restartPolicy"] == "Never" and built["metadata"]["labels"]["app"] == "x"
    assert worker["workingDir"] == "/w" and worker["resources"] == {"limits": {"cpu": "1"}}
    assert "elastic.agent" not in worker["command"][0] and worker["command"][0] == "python"


BAD_TEMPLATES = [
    pytest.param({"spec": {"restartPolicy": "OnFailure"}}, "spec.worker.template.spec.restartPolicy",
                 "restart a failed worker unseen", id="restartPolicy OnFailure would hide failures from the budget"),
    pytest.param({"spec": {"containers": [{"name": "worker", "command": ["bash"]}]}},
                 "spec.worker.template.spec.containers[0].command", "set spec.worker.command instead",
                 id="the worker container's command is the agent's"),
    pytest.param({"spec": {"containers": [{"name": "worker", "args": ["-x"]}]}},
                 "spec.worker.template.spec.containers[0].args", "set spec.worker.args instead",
                 id="so are its args"),
    pytest.param({"spec": {"containers": [{"image": "x"}]}}, "spec.worker.template.spec.containers[0]",
                 "needs a name", id="a container without a name"),
    pytest.param({"spec": {"initContainers": [{"name": "a"}], "containers": [{"name": "a"}]}},
                 "spec.worker.template.spec.containers[0].name", "already the name", id="two containers, one name"),
    pytest.param({"spec": {"initContainers": [{"name": "worker"}]}},
                 "spec.worker.template.spec.initContainers[0].name", "name the init container otherwise",
                 id="an init container named worker"),
    pytest.param({"spec": {"containers": {"name": "worker"}}}, "spec.worker.template.spec.containers",
                 "not a list", id="containers not a list"),
    pytest.param({"metadata": {"labels": {"elastic.dev/job": "other"}}},
                 "spec.worker.template.metadata.labels['elastic.dev/job']", "set by the controller",
                 id="a label the controller selects pods by"),
    pytest.param({"metadata": {"name": "p"}}, "spec.worker.template.metadata.name", "unknown field",
                 id="a pod name (each worker's pod has its own)"),
    pytest.param({"spec": {"containers": [{"name": "worker", "image": "other:1"}]}},
                 "spec.worker.template.spec.containers[0].image", "spec.worker.image is set too",
                 id="an image in two places"),
    pytest.param({"spec": {"containers": [{"name": "worker", "env": [{"name": "A", "value": "2"}]}]}},
                 "spec.worker.template.spec.containers[0].env[0].name", "spec.worker.env too",
                 id="an env name in two places"),
]  # fmt: skip


@pytest.mark.parametrize(("template", "field", "words"), BAD_TEMPLATES)
def test_a_template_the_controller_could_not_honour_is_refused(template: dict, field: str, words: str) -> None:
    job_doc = doc(template=template)
    job_doc["spec"]["worker"].update(image="example/train:1", env=[{"name": "A", "value": "1"}])
    with pytest.raises(SpecError) as refused:
        parse_job(job_doc)
    (line,) = refused.value.problems
    assert line.startswith(f"{field}:") and words in line, line


def test_the_api_server_keeps_the_template_and_refuses_what_the_crd_declares(admin_client) -> None:
    user = client.CustomObjectsApi(admin_client)  # kubectl apply, as a cluster admin

    def apply(job: dict[str, Any]) -> dict[str, Any]:
        return user.create_namespaced_custom_object("elastic.dev", "v1alpha1", "default", "elasticjobs", job)

    stored = apply(doc(name="kept", template=TEMPLATE, image=None))
    assert stored["spec"]["worker"]["template"] == TEMPLATE  # nothing pruned from the PodSpec part
    assert stored["spec"]["startupTimeoutSeconds"] == 600  # defaulted by the CRD
    for name, template, field in (("always", {"spec": {"restartPolicy": "Always"}}, "restartPolicy"),
                                  ("unnamed", {"spec": {"containers": [{"image": "x"}]}}, "containers[0].name")):
        with pytest.raises(client.ApiException) as refused:
            apply(doc(name=name, template=template))
        assert refused.value.status == 422 and f"spec.worker.template.spec.{field}" in refused.value.body, name


def test_a_restricted_namespace_admits_a_template_that_runs_as_non_root(fake: FakeApiServer, core) -> None:
    fake.restricted_namespaces.add("default")
    plain = parse_job(doc(name="rp"))
    with pytest.raises(WorkerStartError) as refused:  # the defaults are all of `restricted` but runAsNonRoot
        KubernetesWorkers(core, plain).start(WorkerLaunch("rp-0001", ["python"], {}))
    assert "violates PodSecurity" in str(refused.value) and "runAsNonRoot" in str(refused.value)
    non_root = {"spec": {"securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
                         "initContainers": [{"name": "fetch", "image": "busybox"}]}}  # fmt: skip
    KubernetesWorkers(core, parse_job(doc(name="rp", template=non_root))).start(WorkerLaunch("rp-0002", ["python"], {}))
    assert ("default", "rp-0002") in fake.pods


def test_a_pod_the_api_server_refuses_fails_the_job_with_its_message(harness) -> None:
    """Refused for every worker alike (an invalid template, Pod Security): a failure said, not a retry loop."""
    h = harness()
    h.fake.restricted_namespaces.add("default")
    status = h.until_done()
    assert status["phase"] == "Failed" and status["reason"] == "WorkerStartFailed", status
    assert "refused its pod" in status["message"] and "violates PodSecurity" in status["message"]


def test_a_job_without_any_image_fails_instead_of_stopping_the_controller(harness) -> None:
    h = harness(worker={"command": ["python", "train.py"]})
    status = h.until_done()
    assert status["reason"] == "WorkerStartFailed" and "spec.worker.image" in status["message"], status


def test_a_worker_that_ends_beside_a_running_sidecar_is_handled_and_its_pod_stopped(harness) -> None:
    sidecar = {"name": "proxy", "image": "example/proxy:1"}
    h = harness(worker={"command": ["python", "train.py"], "image": "example/train:1",
                        "template": {"spec": {"containers": [sidecar]}}})  # fmt: skip
    _, second = h.start_training()
    h.fake.set_pod(second, "Running", 1)  # the worker exited 1; the proxy sidecar still runs
    status = h.step()
    assert status["lastFailure"]["exitCode"] == 1 and h.budget()["used"] == 1
    assert (second, 15) in h.fake.deletions  # deleted gracefully: the sidecar gets its SIGTERM
    _until(lambda: second not in h.pods())


def test_stopping_a_worker_gives_it_the_templates_grace_period(fake: FakeApiServer, core) -> None:
    job = parse_job(doc(name="gp", template={"spec": {"terminationGracePeriodSeconds": 120}}))
    workers = KubernetesWorkers(core, job)
    workers.start(WorkerLaunch("gp-0001", ["python"], {}))
    workers.stop("gp-0001")
    assert fake.deletions == [("gp-0001", 120)]


def _init_failed(code: int, container_reason: str = "Error", **status: Any) -> dict[str, Any]:
    failed = pod("Failed", **status)
    failed["status"]["initContainerStatuses"] = [
        {"name": "ok", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
        {"name": "fetch", "state": {"terminated": {"exitCode": code, "reason": container_reason}}},
    ]
    failed["status"]["containerStatuses"] = [{"name": "worker", "state": {"waiting": {"reason": "PodInitializing"}}}]
    return failed


EVICTED = {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}
INIT_CASES = [
    pytest.param(_init_failed(1), 1, "InitContainerFailed", id="an init container exiting 1 fails the pod"),
    pytest.param(_init_failed(137, "OOMKilled"), 137, "OOMKilled",
                 id="an init container killed for memory is OOMKilled"),
    pytest.param(_init_failed(137, reason="Evicted", conditions=[EVICTED]), 137, "Evicted",
                 id="an eviction during init is an eviction"),
    pytest.param(_init_failed(143, conditions=[{"type": "DisruptionTarget", "status": "True",
                                                "reason": "PreemptionByScheduler"}]), 143, "DisruptionTarget",
                 id="a preemption during init is a disruption"),
    pytest.param(pod("Failed", 2), 2, None, id="the worker's own exit is the worker's (no init container)"),
    pytest.param(pod("Running", 1), 1, None, id="a worker that ended while a sidecar keeps its pod Running"),
    pytest.param(pod("Running", 137, "OOMKilled"), 137, "OOMKilled", id="the same, killed for memory"),
]  # fmt: skip


@pytest.mark.parametrize(("pod_json", "code", "reason"), INIT_CASES)
def test_how_a_pod_ended_is_classified(pod_json: dict, code: int, reason: str | None) -> None:
    seen = observe_pod(pod_json, stopping=False)
    assert (seen.alive, seen.exit_code, seen.reason) == (False, code, reason)
    assert exit_reason(pod_json) == reason


def test_an_init_container_failure_is_charged_and_a_rule_can_fail_the_job_on_it(harness) -> None:
    h = harness()
    _, second = h.start_training()
    h.fake.init_failed(second, "fetch", 1)
    status = h.step()
    assert status["lastFailure"]["exitCode"] == 1 and "InitContainerFailed" in status["lastFailure"]["cause"]
    (charge,) = h.budget()["charges"]
    assert charge["exit_code"] == 1, charge
    strict = harness(failurePolicy={"maxRestarts": 3, "rules": [{"action": "FailJob",
                                                                  "onReasons": ["InitContainerFailed"]}]})  # fmt: skip
    _, second = strict.start_training()
    strict.fake.init_failed(second, "fetch", 1)
    status = strict.until_done()
    assert status["phase"] == "Failed" and "InitContainerFailed" in status["message"], status


def test_a_job_whose_workers_never_start_fails_with_startup_timeout(harness) -> None:
    h = harness(startupTimeoutSeconds=300)
    h.step()
    h.step()
    first, second = h.pods()
    h.fake.set_pod(first, "Running")
    h.fake.set_pod(second, "Pending", waiting="ImagePullBackOff")
    assert h.step()["phase"] == "Created"  # only just created: it waits
    h.fake.created_ago(second, 301)
    status = h.until_done()
    assert status["phase"] == "Failed" and status["reason"] == "StartupTimeout"
    assert f"worker {second}" in status["message"] and "ImagePullBackOff" in status["message"]
    assert "1 of minReplicas 2" in status["message"]
    assert h.kube_job()["status"]["reason"] == "StartupTimeout" and h.reasons()[-1] == "StartupTimeout"
    assert h.budget()["used"] == 0  # nothing was charged: no worker ever ran


def test_a_worker_waiting_for_room_does_not_fail_a_job_that_can_train(harness) -> None:
    h = harness(minReplicas=1, startupTimeoutSeconds=1)
    h.step()
    h.step()
    first, second = h.pods()
    h.fake.run_pod(first)
    h.fake.unschedulable(second)
    h.fake.created_ago(second, 3600)
    status = h.step()
    assert status["phase"] == "Created" and h.controller.run.read().closed is None
    assert status["replicas"] == {"desired": 2, "active": 1}
    (waiting,) = [c for c in status["conditions"] if c["type"] == "WorkersWaiting"]
    assert waiting["reason"] == "Unschedulable" and second in waiting["message"]


def test_an_in_place_job_runs_in_place_agents_in_its_pods(fake: FakeApiServer) -> None:
    """`recovery: InPlace` survives the CRD (not pruned) and becomes the agent's flag in the pod command."""
    from elastic.cluster.pod_manifest import pod_command
    from elastic.controller.launch import agent_command

    stored = fake.add_job(doc(recovery="InPlace"))
    assert stored["spec"]["recovery"] == "InPlace"
    job = parse_job({**stored, "metadata": {"name": "tj", "namespace": "default"}})
    command = pod_command(agent_command(job, "http://etcd:2379", "run-1"))
    assert command[:4] == ["python", "-m", "elastic.agent", "--recovery=in-place"]
    assert "--recovery=in-place" not in pod_command(agent_command(parse_job(doc()), "http://etcd:2379", "run-1"))
