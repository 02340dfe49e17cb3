"""Offline checks of everything that deploys the project: `manifests/`, the Dockerfile and docker-compose.yml.

No Kubernetes API server or container engine runs on these machines, so these tests validate what can be
validated without one: every manifest against the Kubernetes OpenAPI schemas (`kubernetes-validate`, strict:
unknown fields are errors), the ElasticJob sample against the CRD's own schema (`jsonschema`; the API server
would also run the CEL rules, which these tests do not), the CRD against the model it is generated from,
RBAC and pod security by reading the objects, and the compose file with `docker-compose config -q`. A real
cluster would add what none of this can: admission, scheduling, image pulls, DNS and etcd forming a quorum.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from elastic.spec import load_job, openapi_v3_schema
from elastic.spec.crd import build_crd, job_schema

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
SAMPLES = MANIFESTS / "samples"
COMPOSE_FILE = ROOT / "docker-compose.yml"
K8S_VERSION = "1.31"
NAMESPACE = "elastic-system"
IMAGE = "ghcr.io/elastic-etcd/elastic:0.1.0"
ETCD_IMAGE = "quay.io/coreos/etcd:v3.5.17"
REGENERATE = "python -m elastic.spec.crd > manifests/crd.yaml"


def _load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]


def _manifest_files() -> list[Path]:
    return sorted(path for path in MANIFESTS.glob("*.yaml") if path.name != "kustomization.yaml")


def _documents() -> list[tuple[str, dict[str, Any]]]:
    return [(path.name, doc) for path in _manifest_files() for doc in _load_all(path)]


def _find(kind: str, name: str) -> dict[str, Any]:
    found = [doc for _, doc in _documents() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name!r} in manifests/, found {len(found)}"
    return found[0]


def _k8s_validate(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def _crd_schema() -> dict[str, Any]:
    (crd,) = _load_all(MANIFESTS / "crd.yaml")
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with unknown fields as errors everywhere it lists properties (like kubectl --validate=strict)."""
    schema = copy.deepcopy(schema)
    if "properties" in schema:
        schema.pop("x-kubernetes-preserve-unknown-fields", None)
        schema["additionalProperties"] = False
        schema["properties"] = {key: _closed(child) for key, child in schema["properties"].items()}
    if isinstance(schema.get("items"), dict):
        schema["items"] = _closed(schema["items"])
    return schema


def _closed_job_schema() -> dict[str, Any]:
    """The CRD schema, strict about spec (metadata belongs to the API server, which takes any of its fields)."""
    schema = _closed(_crd_schema())
    schema["properties"]["metadata"] = _crd_schema()["properties"]["metadata"]
    return schema


def _pod_specs() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{doc['kind']}/{doc['metadata']['name']}", doc["spec"]["template"]["spec"])
        for _, doc in _documents()
        if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")
    ]


def _flag(args: list[str], name: str) -> str:
    values = [arg.split("=", 1)[1] for arg in args if arg.startswith(f"{name}=")]
    assert len(values) == 1, f"expected {name}=... once in {args}"
    return values[0]


# --- every manifest against the Kubernetes OpenAPI schemas --------------------------------------------------


@pytest.mark.parametrize(
    "doc", [doc for _, doc in _documents()], ids=[f"{f}:{d['kind']}/{d['metadata']['name']}" for f, d in _documents()]
)
def test_manifest_validates_against_the_kubernetes_schema(doc: dict[str, Any]) -> None:
    try:
        _k8s_validate(doc)
    except kubernetes_validate.ValidationError as err:
        path = ".".join(str(part) for part in err.path)
        pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {path}: {err.message}")
    except kubernetes_validate.SchemaNotFoundError as err:
        pytest.fail(f"no Kubernetes {K8S_VERSION} schema to validate against: {err.message}")


def test_strict_validation_rejects_unknown_fields_and_bad_types() -> None:
    """The validator is really strict: the checks above would catch a typo or a wrong type."""
    deployment = copy.deepcopy(_find("Deployment", "elastic-controller"))
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        _k8s_validate(deployment)
    statefulset = copy.deepcopy(_find("StatefulSet", "etcd"))
    statefulset["spec"]["replicas"] = "3"
    with pytest.raises(kubernetes_validate.ValidationError):
        _k8s_validate(statefulset)


def test_kubernetes_validate_has_no_schema_for_elasticjobs() -> None:
    """Why the sample is validated with jsonschema against the CRD below, not with kubernetes-validate."""
    sample = _load_all(SAMPLES / "elasticjob.yaml")[0]
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        _k8s_validate(sample)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text(encoding="utf-8"))
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed)), f"a resource is listed twice: {listed}"
    assert set(listed) == {path.name for path in _manifest_files()}, (
        "manifests/kustomization.yaml must list every manifests/*.yaml (samples are not installed)"
    )


def test_every_object_is_in_elastic_system_or_cluster_scoped() -> None:
    cluster_scoped = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}
    for name, doc in _documents():
        namespace = doc["metadata"].get("namespace")
        if doc["kind"] in cluster_scoped:
            assert namespace is None, f"{name}: {doc['kind']} is cluster-scoped; remove metadata.namespace"
        else:
            assert namespace == NAMESPACE, f"{name}: {doc['kind']}/{doc['metadata']['name']} must be in {NAMESPACE}"


# --- the CRD: generated from the model ----------------------------------------------------------------------


def test_committed_crd_equals_the_one_built_from_the_model() -> None:
    committed = _load_all(MANIFESTS / "crd.yaml")
    assert committed == [build_crd()], (
        f"manifests/crd.yaml and the ElasticJob model disagree; run `{REGENERATE}` and commit the result"
    )


def test_crd_spec_schema_is_the_model_schema() -> None:
    assert _crd_schema()["properties"]["spec"] == openapi_v3_schema()["properties"]["spec"]
    assert _crd_schema() == job_schema()


def test_crd_names_version_and_subresources() -> None:
    crd = build_crd()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "elasticjobs.elastic.dev"
    assert spec["group"] == "elastic.dev"
    assert spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "ElasticJob",
        "listKind": "ElasticJobList",
        "plural": "elasticjobs",
        "singular": "elasticjob",
        "shortNames": ["ej"],
    }
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas.active",
            "labelSelectorPath": ".status.selector",
        },
    }
    columns = [(c["name"], c["jsonPath"]) for c in version["additionalPrinterColumns"]]
    assert columns == [
        ("Phase", ".status.phase"),
        ("Replicas", ".status.replicasText"),
        ("Min", ".spec.minReplicas"),
        ("Max", ".spec.maxReplicas"),
        ("Round", ".status.round"),
        ("Restarts", ".status.restartsText"),
        ("Age", ".metadata.creationTimestamp"),
    ]


def _schema_at(schema: dict[str, Any], json_path: str) -> dict[str, Any]:
    node = schema
    for part in json_path.lstrip(".").split("."):
        assert part in node.get("properties", {}), f"{json_path}: {part!r} is not declared in the CRD schema"
        node = node["properties"][part]
    return node


_COLUMN_TYPES = {"integer": "integer", "number": "number", "string": "string", "boolean": "boolean"}


def test_printer_columns_and_scale_paths_point_at_declared_fields_of_the_right_type() -> None:
    crd = build_crd()
    (version,) = crd["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    for column in version["additionalPrinterColumns"]:
        if column["jsonPath"].startswith(".metadata."):
            continue  # the API server's own fields
        node = _schema_at(schema, column["jsonPath"])
        if column["type"] == "date":
            assert (node["type"], node.get("format")) == ("string", "date-time"), column
        else:
            assert node["type"] == _COLUMN_TYPES[column["type"]], column
    scale = version["subresources"]["scale"]
    assert _schema_at(schema, scale["specReplicasPath"])["type"] == "integer"
    assert _schema_at(schema, scale["statusReplicasPath"])["type"] == "integer"
    assert _schema_at(schema, scale["labelSelectorPath"])["type"] == "string"


# Every field the controller writes (the same fields as the status key in etcd).
FULL_STATUS: dict[str, Any] = {
    "phase": "Running",
    "reason": "Restarted",
    "message": "worker train-ddp-1 exited with 137; round 4 sealed with 3 members",
    "conditions": [
        {
            "type": "Running",
            "status": "True",
            "reason": "RoundSealed",
            "message": "round 4",
            "lastTransitionTime": "2025-01-01T00:00:00Z",
        }
    ],
    "round": 4,
    "worldSize": 3,
    "replicas": {"desired": 3, "active": 2},
    "replicasText": "2/3",
    "restarts": {"used": 1, "max": 3},
    "restartsText": "1/3",
    "lastFailure": {"worker": "train-ddp-1", "exitCode": 137, "reason": "Error", "round": 3},
    "selector": "elastic.dev/job=train-ddp",
    "startTime": "2025-01-01T00:00:00Z",
    "completionTime": "2025-01-01T01:00:00Z",
}


def test_status_schema_declares_every_controller_written_field() -> None:
    status = _closed(_crd_schema()["properties"]["status"])
    jsonschema.Draft7Validator(status).validate(FULL_STATUS)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("round",), "4"),
        (("replicas", "active"), "2"),
        (("replicasText",), 2),
        (("restarts", "used"), 1.5),
        (("conditions", 0, "status"), "Yes"),
        (("lastFailure", "exitCode"), "137"),
    ],
)
def test_status_schema_rejects_wrongly_typed_fields(path: tuple[Any, ...], value: Any) -> None:
    status = copy.deepcopy(FULL_STATUS)
    parent: Any = status
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(_crd_schema()["properties"]["status"]).validate(status)


# --- the sample ElasticJob ----------------------------------------------------------------------------------


def _samples() -> list[Path]:
    return sorted(SAMPLES.glob("*.yaml"))


def test_there_is_a_sample() -> None:
    assert [path.name for path in _samples()] == ["elasticjob.yaml"]


@pytest.mark.parametrize("path", _samples(), ids=lambda path: path.name)
def test_sample_validates_against_the_crd_schema(path: Path) -> None:
    (job,) = _load_all(path)
    jsonschema.Draft7Validator(_crd_schema()).validate(job)
    # The API server would silently prune an unknown (misspelt) field; here it is an error.
    jsonschema.Draft7Validator(_closed_job_schema()).validate(job)


@pytest.mark.parametrize("path", _samples(), ids=lambda path: path.name)
def test_sample_parses_with_the_spec_model(path: Path) -> None:
    job = load_job(path)
    assert job.spec.worker.image == IMAGE
    assert job.spec.worker.command[-1] == "examples/train_ddp.py"


def test_crd_schema_rejects_a_broken_sample() -> None:
    (job,) = _load_all(SAMPLES / "elasticjob.yaml")
    wrong_type = copy.deepcopy(job)
    wrong_type["spec"]["maxReplicas"] = "4"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(_crd_schema()).validate(wrong_type)
    misspelt = copy.deepcopy(job)
    misspelt["spec"]["worker"]["comand"] = misspelt["spec"]["worker"].pop("command")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(_closed_job_schema()).validate(misspelt)


# --- RBAC: least privilege ----------------------------------------------------------------------------------

CLUSTER_RULES = {
    ("", "pods", "get"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "pods", "create"),
    ("", "pods", "delete"),
    ("", "pods/log", "get"),
    ("", "events", "create"),
    ("", "events", "patch"),
    ("elastic.dev", "elasticjobs", "get"),
    ("elastic.dev", "elasticjobs", "list"),
    ("elastic.dev", "elasticjobs", "watch"),
    ("elastic.dev", "elasticjobs", "update"),
    ("elastic.dev", "elasticjobs", "patch"),
    ("elastic.dev", "elasticjobs/status", "get"),
    ("elastic.dev", "elasticjobs/status", "update"),
    ("elastic.dev", "elasticjobs/status", "patch"),
    ("elastic.dev", "elasticjobs/scale", "get"),
    ("elastic.dev", "elasticjobs/scale", "update"),
    ("elastic.dev", "elasticjobs/scale", "patch"),
}
# Leader election: one Lease in the controller's namespace, by name where RBAC allows it.
LEASE_RULES = {
    ("coordination.k8s.io", "leases", "create", None),
    ("coordination.k8s.io", "leases", "get", "elastic-controller"),
    ("coordination.k8s.io", "leases", "update", "elastic-controller"),
}


def _triples(role: dict[str, Any]) -> list[tuple[str, str, str, str | None]]:
    out = []
    for rule in role["rules"]:
        assert "nonResourceURLs" not in rule, f"{role['metadata']['name']}: no non-resource URLs"
        names = rule.get("resourceNames") or [None]
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    for name in names:
                        assert "*" not in (group, resource, verb), f"{role['metadata']['name']}: wildcard in {rule}"
                        out.append((group, resource, verb, name))
    return out


def test_rbac_is_exactly_least_privilege() -> None:
    roles = [doc for _, doc in _documents() if doc["kind"] in ("Role", "ClusterRole")]
    assert sorted((doc["kind"], doc["metadata"]["name"]) for doc in roles) == [
        ("ClusterRole", "elastic-controller"),
        ("Role", "elastic-controller-leader-election"),
    ]
    cluster = _triples(_find("ClusterRole", "elastic-controller"))
    assert len(cluster) == len(set(cluster)), "a ClusterRole rule is granted twice"
    assert all(name is None for *_, name in cluster), "ClusterRole rules are not limited to names"
    assert {(g, r, v) for g, r, v, _ in cluster} == CLUSTER_RULES
    leases = _triples(_find("Role", "elastic-controller-leader-election"))
    assert len(leases) == len(set(leases))
    assert set(leases) == LEASE_RULES


def test_bindings_grant_the_roles_to_the_controller_service_account_only() -> None:
    account = _find("ServiceAccount", "elastic-controller")
    subject = {"kind": "ServiceAccount", "name": "elastic-controller", "namespace": NAMESPACE}
    assert account["metadata"]["namespace"] == NAMESPACE
    bindings = [doc for _, doc in _documents() if doc["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert sorted((doc["kind"], doc["roleRef"]["kind"], doc["roleRef"]["name"]) for doc in bindings) == [
        ("ClusterRoleBinding", "ClusterRole", "elastic-controller"),
        ("RoleBinding", "Role", "elastic-controller-leader-election"),
    ]
    for binding in bindings:
        assert binding["subjects"] == [subject], binding["metadata"]["name"]


# --- the controller and etcd workloads ----------------------------------------------------------------------


def test_controller_deployment_is_hardened_and_has_requests() -> None:
    deployment = _find("Deployment", "elastic-controller")
    assert deployment["spec"]["replicas"] == 2, "two replicas, one leader"
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "elastic-controller"
    assert pod.get("automountServiceAccountToken", True), "the controller talks to the API server"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    (container,) = pod["containers"]
    assert container["image"] == IMAGE
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert "add" not in security["capabilities"]
    assert "privileged" not in security or security["privileged"] is False
    requests = container["resources"]["requests"]
    assert {"cpu", "memory"} <= set(requests)
    assert "memory" in container["resources"]["limits"]
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]], "a writable /tmp on a read-only root filesystem"


def test_controller_command_and_its_etcd_service() -> None:
    (container,) = _find("Deployment", "elastic-controller")["spec"]["template"]["spec"]["containers"]
    command = container["command"] + container.get("args", [])
    assert command[:4] == ["elastic", "controller", "--backend", "kubernetes"]
    url = command[command.index("--etcd") + 1]
    match = re.fullmatch(r"http://([a-z0-9-]+)\.([a-z0-9-]+)\.svc:(\d+)", url)
    assert match, f"--etcd {url}: expected http://<service>.<namespace>.svc:<port>"
    service_name, namespace, port = match.group(1), match.group(2), int(match.group(3))
    service = _find("Service", service_name)
    assert service["metadata"]["namespace"] == namespace
    assert port in [p["port"] for p in service["spec"]["ports"]]
    assert service["spec"].get("clusterIP") != "None", "clients should use the Service that routes to ready members"
    assert service["spec"]["selector"] == _find("StatefulSet", "etcd")["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("workload", [name for name, _ in _pod_specs()])
def test_pods_meet_the_restricted_pod_security_profile(workload: str) -> None:
    """elastic-system enforces `restricted`; a pod that violates it would be refused at admission."""
    assert _find("Namespace", NAMESPACE)["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pod = dict(_pod_specs())[workload]
    pod_security = pod.get("securityContext", {})
    for container in pod["containers"] + pod.get("initContainers", []):
        security = {**pod_security, **container.get("securityContext", {})}
        assert security.get("runAsNonRoot") is True, container["name"]
        assert security.get("runAsUser", 1) != 0, container["name"]
        assert security.get("allowPrivilegeEscalation") is False, container["name"]
        assert security.get("capabilities", {}).get("drop") == ["ALL"], container["name"]
        assert security.get("seccompProfile", {}).get("type") == "RuntimeDefault", container["name"]
        assert "hostPath" not in str(pod.get("volumes", [])), container["name"]
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            assert not pod.get(key), f"{workload}: {key}"


def test_etcd_statefulset_forms_a_three_member_v3_cluster() -> None:
    statefulset = _find("StatefulSet", "etcd")
    spec = statefulset["spec"]
    replicas = spec["replicas"]
    assert replicas == 3
    headless = _find("Service", spec["serviceName"])
    assert headless["metadata"]["name"] == "etcd"
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True, "members must resolve each other before ready"
    assert spec["podManagementPolicy"] == "Parallel", "no member is ready before a quorum exists"
    (container,) = spec["template"]["spec"]["containers"]
    assert container["image"] == ETCD_IMAGE
    args = container["command"] + container.get("args", [])
    assert not any("enable-v2" in arg for arg in args), "v3 API only"
    peer = "http://{name}.etcd.$(POD_NAMESPACE).svc:2380"
    expected = ",".join(f"etcd-{i}={peer.format(name=f'etcd-{i}')}" for i in range(replicas))
    assert _flag(args, "--initial-cluster") == expected
    assert _flag(args, "--name") == "$(POD_NAME)"
    assert _flag(args, "--initial-advertise-peer-urls") == peer.format(name="$(POD_NAME)")
    assert _flag(args, "--initial-cluster-state") == "new"
    env = {item["name"]: item["valueFrom"]["fieldRef"]["fieldPath"] for item in container["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    (claim,) = spec["volumeClaimTemplates"]
    (mount,) = container["volumeMounts"]
    assert mount["name"] == claim["metadata"]["name"]
    assert _flag(args, "--data-dir").startswith(mount["mountPath"] + "/"), "data on the persistent volume"


# --- Dockerfile and docker-compose.yml ----------------------------------------------------------------------


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))


def _docker_compose() -> str:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip(
            "docker-compose is not installed; install it (no container engine needed) with "
            "`apt-get install -y --no-install-recommends docker-compose`"
        )
    return binary


def _compose_config(binary: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary, "-f", str(path), "config", "-q"],
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_docker_compose_config_is_valid() -> None:
    result = _compose_config(_docker_compose(), COMPOSE_FILE)
    assert result.returncode == 0, f"docker-compose config -q failed:\n{result.stderr}"


def test_docker_compose_config_rejects_a_broken_file(tmp_path: Path) -> None:
    binary = _docker_compose()
    broken = _compose()
    broken["services"]["worker"]["depends_on"] = {"etcd": {"condition": "when_it_feels_like_it"}}
    (tmp_path / "docker-compose.yml").write_text(yaml.safe_dump(broken), encoding="utf-8")
    assert _compose_config(binary, tmp_path / "docker-compose.yml").returncode != 0


def test_compose_workers_rendezvous_through_etcd_v3() -> None:
    from elastic.rendezvous.agent import with_defaults

    services = _compose()["services"]
    worker = services["worker"]
    command = worker["command"]
    assert command[0] in ("elastic-agent", "torchrun"), command
    launcher_args = with_defaults(command[1:]) if command[0] == "elastic-agent" else command[1:]
    assert "--rdzv-backend=etcd-v3" in launcher_args, f"the workers must use the etcd-v3 rendezvous: {command}"
    endpoint = _flag(command, "--rdzv-endpoint")
    assert endpoint.split(":")[0] in services, f"--rdzv-endpoint={endpoint} is not a compose service"
    assert _flag(command, "--nnodes") == "1:4"
    assert "job=default/compose-demo" in _flag(command, "--rdzv-conf").split(",")
    assert "examples/train_ddp.py" in command
    checkpoint_dir = command[command.index("--checkpoint-dir") + 1]
    volume, _, target = next(v for v in worker["volumes"] if v.endswith(":" + checkpoint_dir)).partition(":")
    assert volume in _compose()["volumes"], "the checkpoint directory is a named volume shared by all workers"
    assert "etcd" in worker["depends_on"]
    assert target == checkpoint_dir


def test_compose_etcd_serves_the_v3_api_only() -> None:
    services = _compose()["services"]
    etcd = services["etcd"]
    assert etcd["image"] == ETCD_IMAGE
    assert not any("enable-v2" in str(arg) for arg in etcd["command"]), "v3 API only"
    assert "--listen-client-urls=http://0.0.0.0:2379" in etcd["command"]
    controller = services["controller"]["command"]
    assert controller[:4] == ["elastic", "controller", "--backend", "local"]
    assert controller[controller.index("--etcd") + 1] == "http://etcd:2379"


def test_one_image_everywhere_and_it_runs_as_the_non_root_user() -> None:
    compose = _compose()["services"]
    assert compose["controller"]["image"] == compose["worker"]["image"] == IMAGE
    assert compose["controller"]["build"] == compose["worker"]["build"] == "."
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^FROM python:3\.11-slim\s*$", dockerfile, re.M)
    (user,) = re.findall(r"^USER\s+(\S+)\s*$", dockerfile, re.M)
    uid = user.split(":")[0]
    assert uid.isdigit() and uid != "0", "a numeric non-root USER, so the kubelet can verify runAsNonRoot"
    pod = _find("Deployment", "elastic-controller")["spec"]["template"]["spec"]
    assert str(pod["securityContext"]["runAsUser"]) == uid
    assert "WORKDIR /app" in dockerfile
    assert re.search(r"^COPY examples \./examples\s*$", dockerfile, re.M), "the sample runs examples/train_ddp.py"


def test_dockerignore_keeps_what_the_dockerfile_copies() -> None:
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()]
    patterns = [line for line in lines if line and not line.startswith("#")]
    assert patterns[0] == "*", "an allowlist: everything is excluded unless re-included"
    included = {pattern[1:] for pattern in patterns if pattern.startswith("!")}
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    for sources in re.findall(r"^COPY\s+(.+?)\s+\S+\s*$", dockerfile, re.M):
        for source in sources.split():
            assert source.rstrip("/") in included, f"COPY {source}: .dockerignore excludes it"
            assert (ROOT / source).exists(), f"COPY {source}: no such file"
