"""A FAKE Kubernetes API server that follows the real one's rules, for the resources the controller uses.

No kube-apiserver, kind, k3s or minikube can run on these machines, so this serves, on 127.0.0.1 over
HTTP, what the real `kubernetes` client sends, with the semantics a controller depends on (each is a rule
the real server enforces and a bug a looser fake would hide):
- one global, increasing `resourceVersion` for every write; `generation` bumped on spec changes only;
- `PUT` with a stale `resourceVersion` is 409 Conflict; a custom resource `PUT` without one is 422;
- the status subresource writes `.status` only, the main resource ignores `.status`;
- merge patch (RFC 7386), JSON patch (RFC 6902), strategic merge patch as a merge patch except for
  `metadata.finalizers` (patch strategy merge: lists joined, `$deleteFromPrimitiveList` removes);
- list with label/field selectors and the list's resourceVersion; watch from a resourceVersion with
  ADDED/MODIFIED/DELETED events, bookmarks, `timeoutSeconds`, and 410 Gone for a compacted version;
- ElasticJobs pruned, defaulted, validated and checked by their CEL rules from manifests/crd.yaml
  (`fake_schema.py`), the `/scale` subresource as apiextensions serves it (GET with `spec.replicas` absent
  or null is a 500, so an HPA cannot read such a job; a write sets it, and one without replicas is a 400);
- the eviction API honouring PodDisruptionBudgets (`minAvailable` healthy pods, i.e. Running and Ready: an
  eviction that would go below is a 429);
- deletion: finalizers and `deletionTimestamp`, graceful deletion of running pods (the kubelet ends them),
  background garbage collection of dependents through `ownerReferences`;
- names and labels validated (DNS-1123, 63-character label values), `generateName`; `managedFields` on
  every object, as server-side apply keeps them;
- RBAC from manifests/rbac.yaml enforced for the controller (a request outside it is 403), a `restricted`
  Pod Security namespace refuses a pod that is not restricted-compatible (403);
- injectable failures (429/5xx for N matching requests) and latency, and the network's own: a blackhole
  (`blackhole()`: the controller's requests are read and never answered, its open watches go silent; after
  `restore()` new requests are answered, while those connections stay half-open, silent for good),
  `reset_connections()` (every open connection, a watch mid-stream included, closed with no answer),
  `restart()` (that, plus the watch cache gone: resuming an old version is 410), and
  `random_faults(seed, count)` (a seeded, bounded number of 409/429/500/503 answers, resets, and answers
  lost after the request was carried out).

There is no scheduler and no kubelet process: tests play them with the `kubelet` methods below (schedule,
run, terminate, image pull back-off, unschedulable, an init container failing, node partition, eviction,
preemption, a pod that ends and vanishes at once, a pod created long ago). Requests authenticated as
`Bearer admin` are a cluster admin (a test acting as the user); every other request is the controller's
service account. Every request is recorded as an RBAC
(apiGroup, resource, verb) triple.
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import yaml
from fake_schema import admit

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
ADMIN_TOKEN = "admin"

PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<res>[a-z]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>status|scale|eviction))?)?$"
)
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Kind:
    kind: str
    api_version: str
    status_subresource: bool = False
    unconditional_update: bool = True  # custom resources need a resourceVersion on PUT


KINDS = {
    ("", "pods"): Kind("Pod", "v1", status_subresource=True),
    ("", "events"): Kind("Event", "v1"),
    ("coordination.k8s.io", "leases"): Kind("Lease", "coordination.k8s.io/v1"),
    ("policy", "poddisruptionbudgets"): Kind("PodDisruptionBudget", "policy/v1"),
    ("elastic.dev", "elasticjobs"): Kind(
        "ElasticJob", "elastic.dev/v1alpha1", status_subresource=True, unconditional_update=False
    ),
}


def now_text() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A merge patch, except for `metadata.finalizers`, whose patch strategy is merge: the lists are joined,
    and only `$deleteFromPrimitiveList/finalizers` takes entries out (the rule that makes a naive strategic
    patch of finalizers add instead of replace). Other lists the controller never patches strategically."""
    patch = copy.deepcopy(patch)
    meta = patch.get("metadata") or {}
    removed = meta.pop("$deleteFromPrimitiveList/finalizers", [])
    if "finalizers" in meta and meta["finalizers"] is not None:
        current = (target.get("metadata") or {}).get("finalizers") or []
        meta["finalizers"] = current + [f for f in meta["finalizers"] if f not in current]
    result = merge_patch(target, patch)
    if removed:
        kept = [f for f in result["metadata"].get("finalizers") or [] if f not in removed]
        result["metadata"]["finalizers"] = kept
    return result


def json_patch(target: Any, operations: list[dict[str, Any]]) -> Any:
    """RFC 6902 (add, remove, replace, test); a failed `test` is a 422, as on the real server."""
    document = copy.deepcopy(target)
    for operation in operations:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]]
        parent = document
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        op = operation["op"]
        if op == "test":
            current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if current != operation["value"]:
                raise ApiError(422, "Invalid", f"the test of {operation['path']} failed")
        elif op == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if op == "add":
                parent.insert(index, operation["value"])
            else:
                parent[index] = operation["value"]
        else:
            parent[last] = operation["value"]
    return document


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, causes: list[dict[str, str]] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.causes = code, reason, causes or []

    def status(self) -> dict[str, Any]:
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": str(self),
                "reason": self.reason, "code": self.code}  # fmt: skip
        if self.causes:
            body["details"] = {"causes": self.causes}
        return body


@dataclass
class Fault:
    """Answer `code` to the next `times` requests matching (verb, resource); None matches anything."""

    code: int
    times: int
    verb: str | None = None
    resource: str | None = None


class Dropped(Exception):
    """The connection goes with no answer (the request may have been carried out: `lost`)."""


@dataclass
class RandomFaults:
    """Each request of the controller fails with `probability`, `left` times in all, as `rng` picks: an HTTP
    error, a reset before the request is carried out, or the answer lost after it was."""

    rng: random.Random
    left: int
    probability: float
    kinds: tuple[int | str, ...] = (409, 429, 500, 503, "reset", "lost")

    def draw(self) -> int | str | None:
        if self.left <= 0 or self.rng.random() >= self.probability:
            return None
        self.left -= 1
        return self.rng.choice(self.kinds)


def _labels_problem(labels: dict[str, Any]) -> str | None:
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if (
            (prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix)))
            or len(name) > 63
            or not LABEL_NAME.match(name)
        ):
            return (
                f"metadata.labels: Invalid value: {key!r}: name part must consist of alphanumeric characters, "
                "'-', '_' or '.', and be at most 63 characters"
            )
        if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
            return f"metadata.labels: Invalid value: {value!r}: must be no more than 63 characters"
    return None


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """Equality-based label selectors: `a=b`, `a==b`, `a!=b`, `a` (exists), `!a`, comma-separated."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _restricted_problem(pod: dict[str, Any]) -> str | None:
    """The `restricted` Pod Security Standard, in the parts a worker pod can break."""
    spec = pod.get("spec") or {}
    pod_context = spec.get("securityContext") or {}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        context, name = container.get("securityContext") or {}, container["name"]
        if context.get("allowPrivilegeEscalation") is not False:
            return f'allowPrivilegeEscalation != false (container "{name}" must set allowPrivilegeEscalation=false)'
        if "ALL" not in ((context.get("capabilities") or {}).get("drop") or []):
            return f'unrestricted capabilities (container "{name}" must set capabilities.drop=["ALL"])'
        if not (context.get("runAsNonRoot") or pod_context.get("runAsNonRoot")):
            return f'runAsNonRoot != true (container "{name}" must set securityContext.runAsNonRoot=true)'
        seccomp = (context.get("seccompProfile") or pod_context.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            return "seccompProfile (pod or containers must set seccompProfile.type to RuntimeDefault or Localhost)"
    return None


class FakeApiServer:
    def __init__(self, rbac: Path | None = MANIFESTS / "rbac.yaml", kubelet_seconds: float = 0.05) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.objects: dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]] = {key: {} for key in KINDS}
        self.history: list[tuple[int, str, str, str, dict[str, Any]]] = []  # (rv, group, resource, type, object)
        self.compacted_before = 0  # watches from an older resourceVersion get 410 Gone
        self.revision = 1  # as etcd's: a list never answers "0", which a watch reads as "from now"
        self.requests: list[tuple[str, str, str]] = []  # (apiGroup, resource, verb) of the controller's requests
        self.deletions: list[tuple[str, int | None]] = []  # (pod name, gracePeriodSeconds)
        self.patch_types: list[str] = []
        self.faults: list[Fault] = []
        self.latency = 0.0
        self.fail_leases = False  # shorthand: every lease request answers 503
        self.restricted_namespaces: set[str] = set()
        self.partitioned: set[str] = set()  # nodes whose kubelet no longer reaches the API server
        self.bookmark_seconds = 1.0
        self.kubelet_seconds = kubelet_seconds  # how long a running pod takes to stop after a graceful delete
        self.allowed = rbac_allows(list(yaml.safe_load_all(rbac.read_text()))) if rbac else None
        crd = yaml.safe_load((MANIFESTS / "crd.yaml").read_text())
        self.job_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        self.scale_paths = crd["spec"]["versions"][0]["subresources"]["scale"]
        self._stopped = False
        self._watch_generation = 0
        self.answering = threading.Event()  # cleared while blackholed
        self.answering.set()
        self.stopping = threading.Event()  # what a request held in a blackhole waits for
        self.held = 0  # requests and watches a blackhole caught
        self.random: RandomFaults | None = None
        self.injected: list[int | str] = []  # what random_faults injected, in order
        handler = type("Handler", (_Handler,), {"fake": self})
        self.httpd = _Server(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> FakeApiServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        with self.lock:
            self._stopped = True
            self.changed.notify_all()
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    # --- views the tests read ---

    @property
    def pods(self) -> dict[tuple[str, str], dict[str, Any]]:
        return self.objects[("", "pods")]

    @property
    def jobs(self) -> dict[tuple[str, str], dict[str, Any]]:
        return self.objects[("elastic.dev", "elasticjobs")]

    @property
    def leases(self) -> dict[tuple[str, str], dict[str, Any]]:
        return self.objects[("coordination.k8s.io", "leases")]

    @property
    def events(self) -> list[dict[str, Any]]:
        return list(self.objects[("", "events")].values())

    def pods_of(self, job: str, namespace: str = "default") -> dict[str, dict[str, Any]]:
        with self.lock:
            return {
                name: pod for (ns, name), pod in self.pods.items()
                if ns == namespace and pod["metadata"].get("labels", {}).get("elastic.dev/job") == job
            }  # fmt: skip

    def events_for(self, job: str) -> list[dict[str, Any]]:
        with self.lock:
            return [e for e in self.events if e["involvedObject"]["name"] == job]

    # --- the user (kubectl) ---

    def add_job(self, job: dict[str, Any]) -> dict[str, Any]:
        """`kubectl apply` of an ElasticJob: admitted by the CRD's schema like any create."""
        with self.lock:
            namespace = (job.get("metadata") or {}).get("namespace", "default")
            return self._create("elastic.dev", "elasticjobs", namespace, copy.deepcopy(job))

    def delete_job(self, name: str, namespace: str = "default") -> None:
        """`kubectl delete ej NAME` (background propagation)."""
        with self.lock:
            self._delete("elastic.dev", "elasticjobs", namespace, name, None)

    def compact(self) -> None:
        """etcd compaction, then the API server's watch cache dropping its watchers (as a restart does):
        every open watch ends, and resuming from a resourceVersion older than now gets 410 Gone."""
        with self.lock:
            self.compacted_before = self.revision + 1
            self.history.clear()
            self._watch_generation += 1
            self.changed.notify_all()

    # --- the network and the server process ---

    def blackhole(self) -> None:
        """The controller's requests are accepted and read, and never answered; its open watches send
        nothing more (no event, no bookmark). The user's (admin) requests still go through: the controller
        alone is cut off, as behind a broken load balancer."""
        self.answering.clear()

    def restore(self) -> None:
        """The end of the blackhole: new requests are answered again. Those held in it never are, as on a
        half-open connection: only the client's own timeout ends them."""
        self.answering.set()

    def reset_connections(self) -> None:
        """Every open connection (kept-alive ones, watches mid-stream) is closed with no further byte."""
        self.httpd.drop_all()

    def restart(self) -> None:
        """kube-apiserver restarting: every connection dropped and the watch cache rebuilt from now, so a
        watch resumed from an older resourceVersion is 410 Gone (the objects, in etcd, stay)."""
        self.reset_connections()
        self.compact()

    def _hold(self) -> None:
        """A request or watch caught in the blackhole: half-open until the server stops."""
        with self.lock:
            self.held += 1
        self.stopping.wait()

    def random_faults(self, seed: int, count: int, probability: float = 0.2) -> None:
        """From now on, `count` of the controller's requests, picked with `probability` by `seed`, fail."""
        self.random = RandomFaults(random.Random(seed), count, probability)

    def _draw_fault(self, admin: bool) -> int | str | None:
        with self.lock:
            fault = None if admin or self.random is None else self.random.draw()
            if fault is not None:
                self.injected.append(fault)
            return fault

    # --- the kubelet and the scheduler, scripted ---

    def set_pod(
        self,
        name: str,
        phase: str,
        exit_code: int | None = None,
        container_reason: str | None = None,
        reason: str | None = None,
        conditions: list[dict[str, Any]] | None = None,
        namespace: str = "default",
        ready: bool | None = None,
        waiting: str | None = None,
    ) -> None:
        """The pod's phase, its worker container's state, the pod's reason and conditions."""
        with self.lock:
            pod = self.pods[(namespace, name)]
            status: dict[str, Any] = {"phase": phase}
            creating = {"waiting": {"reason": "ContainerCreating"}}
            image = pod["spec"]["containers"][0].get("image", "")
            container: dict[str, Any] = {"name": "worker", "ready": False, "restartCount": 0, "state": creating,
                                         "image": image, "imageID": ""}  # fmt: skip
            if phase in ("Running", "Succeeded", "Failed", "Unknown"):
                pod["spec"].setdefault("nodeName", "node-1")
            if phase == "Running":
                container["state"] = {"running": {"startedAt": now_text()}}
                container["ready"] = True if ready is None else ready
            if waiting:
                container["state"] = {"waiting": {"reason": waiting, "message": f"{waiting} (scripted)"}}
            if exit_code is not None:
                container["state"] = {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": container_reason or ("Completed" if exit_code == 0 else "Error"),
                    }
                }
            status["containerStatuses"] = [container]
            status["conditions"] = [{"type": "Ready", "status": "True" if container["ready"] else "False"}]
            if reason:
                status["reason"] = reason
            if conditions:
                status["conditions"] += conditions
            pod["status"] = status
            self._changed("", "pods", "MODIFIED", pod)

    def run_pod(self, name: str, namespace: str = "default") -> None:
        self.set_pod(name, "Running", namespace=namespace)

    def unschedulable(self, name: str, namespace: str = "default") -> None:
        with self.lock:
            pod = self.pods[(namespace, name)]
            pod["status"] = {"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]}  # fmt: skip
            self._changed("", "pods", "MODIFIED", pod)

    def init_failed(self, name: str, init: str, exit_code: int, namespace: str = "default") -> None:
        """An init container ended non-zero: with restartPolicy Never the pod is Failed and its worker
        container never left PodInitializing (no exit code of its own)."""
        with self.lock:
            pod = self.pods[(namespace, name)]
            pod["spec"].setdefault("nodeName", "node-1")
            terminated = {"exitCode": exit_code, "reason": "Error", "finishedAt": now_text()}
            pod["status"] = {
                "phase": "Failed",
                "conditions": [{"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized"},
                               {"type": "Ready", "status": "False"}],
                "initContainerStatuses": [{"name": init, "ready": False, "restartCount": 0,
                                           "state": {"terminated": terminated}}],
                "containerStatuses": [{"name": "worker", "ready": False, "restartCount": 0,
                                       "state": {"waiting": {"reason": "PodInitializing"}}}],
            }  # fmt: skip
            self._changed("", "pods", "MODIFIED", pod)

    def created_ago(self, name: str, seconds: float, namespace: str = "default") -> None:
        """Backdate the pod's creationTimestamp (a pod waiting since long before the test began)."""
        with self.lock:
            pod = self.pods[(namespace, name)]
            when = datetime.fromtimestamp(time.time() - seconds, timezone.utc)
            pod["metadata"]["creationTimestamp"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
            self._changed("", "pods", "MODIFIED", pod)

    def partition(self, node: str = "node-1") -> list[str]:
        """The node stops reporting: its pods turn Unknown (their containers may still run)."""
        with self.lock:
            self.partitioned.add(node)
            lost = []
            for (_, name), pod in self.pods.items():
                if pod["spec"].get("nodeName") == node and pod["status"].get("phase") == "Running":
                    pod["status"] = {
                        **pod["status"],
                        "phase": "Unknown",
                        "reason": "NodeLost",
                        "message": f"Node {node} which was running pod {name} is unresponsive",
                    }
                    self._changed("", "pods", "MODIFIED", pod)
                    lost.append(name)
            return lost

    def disrupt(self, name: str, reason: str, namespace: str = "default") -> None:
        """Eviction (EvictionByEvictionAPI), preemption (PreemptionByScheduler) or a taint (DeletionByTaintManager):
        the DisruptionTarget condition, then a graceful delete, as the control plane does."""
        with self.lock:
            pod = self.pods[(namespace, name)]
            condition = {"type": "DisruptionTarget", "status": "True", "reason": reason,
                         "lastTransitionTime": now_text()}  # fmt: skip
            pod["status"]["conditions"] = [*(pod["status"].get("conditions") or []), condition]
            self._changed("", "pods", "MODIFIED", pod)
            self._delete("", "pods", namespace, name, 30)

    def end_and_vanish(self, name: str, exit_code: int, namespace: str = "default") -> None:
        """The pod ends and is deleted right after (within the kubelet's delay): a poll may never see it end."""
        self.set_pod(name, "Failed", exit_code, namespace=namespace)
        with self.lock:
            self._delete("", "pods", namespace, name, 0)

    def vanish(self, name: str, namespace: str = "default") -> None:
        """Gone without a trace (force-deleted with its node): a DELETED event and nothing else."""
        with self.lock:
            pod = self.pods.pop((namespace, name))
            self._changed("", "pods", "DELETED", pod)

    # --- the store ---

    def _next(self) -> str:
        self.revision += 1
        return str(self.revision)

    def _changed(self, group: str, resource: str, kind: str, obj: dict[str, Any]) -> None:
        if kind != "DELETED":
            obj["metadata"]["resourceVersion"] = self._next()
        self.history.append((int(obj["metadata"]["resourceVersion"]), group, resource, kind, copy.deepcopy(obj)))
        self.changed.notify_all()

    def _validate_meta(self, resource: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        name = meta["name"]
        pattern, limit = (DNS1123_LABEL, 63) if resource == "elasticjobs" else (DNS1123_SUBDOMAIN, 253)
        if len(name) > limit or not pattern.match(name):
            raise ApiError(
                422,
                "Invalid",
                f'{resource} "{name}" is invalid: metadata.name: Invalid value: '
                f'"{name}": a lowercase RFC 1123 name of at most {limit} characters',
            )
        problem = _labels_problem(meta.get("labels") or {})
        if problem:
            raise ApiError(422, "Invalid", f'{resource} "{name}" is invalid: {problem}')

    def _admit(self, group: str, resource: str, obj: dict[str, Any], only: str | None = None) -> dict[str, Any]:
        if resource != "elasticjobs":
            return obj
        admitted, causes = admit(obj, self.job_schema, only=only)
        if causes:
            name = obj["metadata"].get("name")
            text = "; ".join(f"{c.field}: {c.message}" for c in causes)
            raise ApiError(
                422,
                "Invalid",
                f'ElasticJob.elastic.dev "{name}" is invalid: {text}',
                [{"field": c.field, "message": c.message} for c in causes],
            )
        return admitted

    def _create(self, group: str, resource: str, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        store = self.objects[(group, resource)]
        meta = body.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
        if not meta.get("name"):
            raise ApiError(422, "Invalid", "metadata.name: Required value: name or generateName is required")
        if meta.get("namespace", ns) != ns:
            raise ApiError(400, "BadRequest", "the namespace of the object does not match the namespace on the request")
        self._validate_meta(resource, body)
        if (ns, meta["name"]) in store:
            raise ApiError(409, "AlreadyExists", f'{resource} "{meta["name"]}" already exists')
        if resource == "pods" and ns in self.restricted_namespaces:
            problem = _restricted_problem(body)
            if problem:
                raise ApiError(
                    403,
                    "Forbidden",
                    f'pods "{meta["name"]}" is forbidden: violates PodSecurity "restricted:latest": {problem}',
                )
        kind = KINDS[(group, resource)]
        body["apiVersion"], body["kind"] = kind.api_version, kind.kind
        meta.update({"namespace": ns, "uid": str(uuid.uuid4()), "creationTimestamp": now_text(), "generation": 1})
        # Server-side apply's record of who set which field: on every object the real server returns, often
        # the bulk of its metadata (what an informer should not keep).
        meta["managedFields"] = [{"manager": "fake", "operation": "Update", "apiVersion": kind.api_version,
                                  "time": now_text(), "fieldsType": "FieldsV1",
                                  "fieldsV1": {"f:metadata": {"f:labels": {}}, "f:spec": {}}}]  # fmt: skip
        for dropped in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(dropped, None)
        if kind.status_subresource:
            body.pop("status", None)
        if resource == "pods":
            body["status"] = {"phase": "Pending"}
        body = self._admit(group, resource, body)
        store[(ns, meta["name"])] = body
        self._changed(group, resource, "ADDED", body)
        return body

    def _get(self, group: str, resource: str, ns: str, name: str) -> dict[str, Any]:
        obj = self.objects[(group, resource)].get((ns, name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{resource} "{name}" not found')
        return obj

    def _write(
        self, group: str, resource: str, ns: str, name: str, wanted: dict[str, Any], sub: str | None
    ) -> dict[str, Any]:
        """Store `wanted` as the new object, keeping whatever half the request may not change."""
        kind = KINDS[(group, resource)]
        current = self._get(group, resource, ns, name)
        sent = (wanted.get("metadata") or {}).get("resourceVersion")
        if sent and sent != current["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {resource} "{name}": the object has '
                "been modified; please apply your changes to the latest version and try again",
            )
        if sub == "status":
            updated = {**copy.deepcopy(current), "status": wanted.get("status")}
            updated = self._admit(group, resource, updated, only="status")
        else:
            meta = copy.deepcopy(current["metadata"])
            for key in ("labels", "annotations", "finalizers", "ownerReferences"):
                if key in (wanted.get("metadata") or {}):
                    meta[key] = wanted["metadata"][key]
                else:
                    meta.pop(key, None)
            if current["metadata"].get("deletionTimestamp") and len(meta.get("finalizers") or []) > len(
                current["metadata"].get("finalizers") or []
            ):
                raise ApiError(
                    422,
                    "Invalid",
                    "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted",
                )
            updated = {**{k: v for k, v in wanted.items() if k != "metadata"}, "metadata": meta}
            if kind.status_subresource:
                updated["status"] = copy.deepcopy(current.get("status"))
                if updated["status"] is None:
                    updated.pop("status")
            updated["apiVersion"], updated["kind"] = kind.api_version, kind.kind
            self._validate_meta(resource, updated)
            updated = self._admit(group, resource, updated)
            if updated.get("spec") != current.get("spec"):
                updated["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
        if updated == current:
            return current  # a no-op write changes no resourceVersion
        self.objects[(group, resource)][(ns, name)] = updated
        if updated["metadata"].get("deletionTimestamp") and not updated["metadata"].get("finalizers"):
            return self._remove(group, resource, ns, name)
        self._changed(group, resource, "MODIFIED", updated)
        return updated

    def _delete(self, group: str, resource: str, ns: str, name: str, grace: int | None,
                preconditions: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
        obj = self._get(group, resource, ns, name)
        meta = obj["metadata"]
        for key in ("uid", "resourceVersion"):
            if preconditions and preconditions.get(key) and preconditions[key] != meta.get(key):
                raise ApiError(
                    409,
                    "Conflict",
                    f"Precondition failed: {key} in precondition: {preconditions[key]}, "
                    f"{key} in object meta: {meta.get(key)}",
                )
        if resource == "pods":
            self.deletions.append((name, grace))
        graceful = resource == "pods" and self._runs(obj) and (grace is None or grace > 0)
        if meta.get("finalizers") or graceful:
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = now_text()
                meta["deletionGracePeriodSeconds"] = 30 if grace is None else grace
                self._changed(group, resource, "MODIFIED", obj)
                if graceful:
                    threading.Timer(self.kubelet_seconds, self._kubelet_stops, (ns, name)).start()
            return obj
        return self._remove(group, resource, ns, name)

    @staticmethod
    def _runs(pod: dict[str, Any]) -> bool:
        """Bound to a node and not terminal (Unknown included): only that node's kubelet may finish it."""
        return bool(pod["spec"].get("nodeName")) and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")

    def _kubelet_stops(self, ns: str, name: str) -> None:
        """The kubelet ends a pod deleted gracefully: SIGTERM (exit 143), then the pod object goes."""
        with self.lock:
            pod = self.pods.get((ns, name))
            if pod is None or self._stopped or pod["spec"].get("nodeName") in self.partitioned:
                return  # a partitioned node's kubelet hears nothing: the pod stays, marked for deletion
            terminated = {"exitCode": 143, "reason": "Error"}
            pod["status"] = {
                **pod["status"],
                "phase": "Failed",
                "containerStatuses": [{"name": "worker", "ready": False, "state": {"terminated": terminated}}],
            }
            pod["spec"]["nodeName"] = pod["spec"].get("nodeName") or "node-1"
            if pod["metadata"].get("finalizers"):
                self._changed("", "pods", "MODIFIED", pod)
            else:
                self._remove("", "pods", ns, name)

    def _remove(self, group: str, resource: str, ns: str, name: str) -> dict[str, Any]:
        obj = self.objects[(group, resource)].pop((ns, name))
        obj["metadata"]["resourceVersion"] = self._next()
        self._changed(group, resource, "DELETED", obj)
        uid = obj["metadata"]["uid"]
        for (dgroup, dresource), store in self.objects.items():  # background garbage collection
            for (dns, dname), dependent in list(store.items()):
                owners = dependent["metadata"].get("ownerReferences") or []
                if dns == ns and any(o.get("uid") == uid for o in owners) and (dns, dname) in store:
                    self._delete(dgroup, dresource, dns, dname, None)
        return obj

    # --- the API ---

    def handle(self, method: str, path: str, query: dict[str, list[str]], body: Any, content_type: str,
               admin: bool) -> Any:  # fmt: skip
        match = PATH.match(path)
        if not match or (match["group"] or "", match["res"]) not in KINDS:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        group, resource, ns, name, sub = match["group"] or "", match["res"], match["ns"], match["name"], match["sub"]
        watching = query.get("watch", ["false"])[0].lower() in ("true", "1")
        verb = {"GET": "get" if name else ("watch" if watching else "list"), "POST": "create", "PUT": "update",
                "PATCH": "patch", "DELETE": "delete"}[method]  # fmt: skip
        rbac_resource = f"{resource}/{sub}" if sub else resource
        if self.latency:
            time.sleep(self.latency)
        with self.lock:
            if not admin:
                self.requests.append((group, rbac_resource, verb))
                if method == "PATCH":
                    self.patch_types.append(content_type)
                if self.allowed is not None and (group, rbac_resource, verb) not in self.allowed:
                    raise ApiError(
                        403,
                        "Forbidden",
                        f'{rbac_resource} is forbidden: User "system:serviceaccount:'
                        f'elastic-system:elastic-controller" cannot {verb} resource "{rbac_resource}" in '
                        f'API group "{group}" in the namespace "{ns}"',
                    )
                self._inject(verb, resource)
            if verb in ("list", "watch"):
                return self._list(group, resource, ns, query)
            if verb == "create" and sub == "eviction":
                return self._evict(ns, name)
            if verb == "create":
                return self._create(group, resource, ns, copy.deepcopy(body))
            if verb == "get":
                obj = self._get(group, resource, ns, name)
                return self._scale(obj) if sub == "scale" else obj
            if verb == "delete":
                grace = query.get("gracePeriodSeconds", [None])[0]
                options = body or {}
                if grace is None and options.get("gracePeriodSeconds") is not None:
                    grace = options["gracePeriodSeconds"]
                return self._delete(
                    group, resource, ns, name, None if grace is None else int(grace), options.get("preconditions")
                )
            current = self._get(group, resource, ns, name)
            if sub == "scale":
                return self._rescale(group, resource, ns, name, current, body, verb, content_type)
            if verb == "update":
                if not KINDS[(group, resource)].unconditional_update and not (body.get("metadata") or {}).get(
                    "resourceVersion"
                ):
                    raise ApiError(
                        422, "Invalid", "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
                    )
                return self._write(group, resource, ns, name, body, sub)
            return self._write(group, resource, ns, name, self._patched(current, body, content_type), sub)

    def _evict(self, ns: str, name: str) -> dict[str, Any]:
        """POST pods/NAME/eviction: refused (429) while a budget selecting the pod would fall below its
        minAvailable healthy pods; else the DisruptionTarget condition and a graceful delete."""
        pod = self._get("", "pods", ns, name)
        labels = pod["metadata"].get("labels") or {}

        def healthy(other: dict[str, Any]) -> bool:
            ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in (other.get("status") or {}).get("conditions") or [])  # fmt: skip
            running = (other.get("status") or {}).get("phase") == "Running"
            return ready and running and not other["metadata"].get("deletionTimestamp")

        for (bns, bname), budget in self.objects[("policy", "poddisruptionbudgets")].items():
            wanted = ((budget.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            if bns != ns or any(labels.get(k) != v for k, v in wanted.items()):
                continue
            selected = [o for (ons, _), o in self.pods.items()
                        if ons == ns and all((o["metadata"].get("labels") or {}).get(k) == v
                                             for k, v in wanted.items())]  # fmt: skip
            left = sum(map(healthy, selected)) - (1 if healthy(pod) else 0)
            if left < int(budget["spec"].get("minAvailable", 0)):
                raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption "
                               "budget.", [{"reason": "DisruptionBudget", "message": f"The disruption budget "
                               f"{bname} needs {budget['spec']['minAvailable']} healthy pods"}])  # fmt: skip
        self.disrupt(name, "EvictionByEvictionAPI", ns)
        return {"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}}

    def _inject(self, verb: str, resource: str) -> None:
        if self.fail_leases and resource == "leases":
            raise ApiError(503, "ServiceUnavailable", "lease calls fail (simulated outage)")
        for fault in self.faults:
            if fault.times > 0 and fault.verb in (None, verb) and fault.resource in (None, resource):
                fault.times -= 1
                reason = {429: "TooManyRequests", 409: "Conflict", 403: "Forbidden", 422: "Invalid"}.get(
                    fault.code, "InternalError"
                )
                raise ApiError(fault.code, reason, f"injected {fault.code} for {verb} {resource}")

    @staticmethod
    def _patched(current: dict[str, Any], body: Any, content_type: str) -> dict[str, Any]:
        json_patched = content_type.startswith("application/json-patch+json")
        if not isinstance(body, list if json_patched else dict):  # a JSON patch is a list, the others objects
            raise ApiError(400, "BadRequest", f"the body of a {content_type} patch must be a JSON "
                           f"{'array' if json_patched else 'object'}")  # fmt: skip
        if json_patched:
            return json_patch(current, body)
        if content_type.startswith("application/merge-patch+json"):
            return merge_patch(current, body)
        if content_type.startswith("application/strategic-merge-patch+json"):
            return strategic_merge_patch(current, body)
        raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {content_type}")

    def _list(self, group: str, resource: str, ns: str | None, query: dict[str, list[str]]) -> dict[str, Any]:
        label_selector = query.get("labelSelector", [""])[0]
        field_selector = query.get("fieldSelector", [""])[0]
        items = [copy.deepcopy(obj) for (ons, _), obj in self.objects[(group, resource)].items()
                 if (ns is None or ons == ns) and self._selected(obj, label_selector, field_selector)]  # fmt: skip
        kind = KINDS[(group, resource)]
        return {"kind": f"{kind.kind}List", "apiVersion": kind.api_version,
                "metadata": {"resourceVersion": str(self.revision)}, "items": items}  # fmt: skip

    @staticmethod
    def _selected(obj: dict[str, Any], label_selector: str, field_selector: str) -> bool:
        if not selector_matches(label_selector, obj["metadata"].get("labels") or {}):
            return False
        for term in filter(None, field_selector.split(",")):
            key, value = term.split("=", 1)
            actual = {"metadata.name": obj["metadata"]["name"], "metadata.namespace": obj["metadata"]["namespace"]}
            if actual.get(key) != value:
                return False
        return True

    def _scale(self, obj: dict[str, Any], unset: int | None = None) -> dict[str, Any]:
        """The Scale of `obj` as apiextensions computes it. A missing spec field is a 500 on GET ("the spec
        replicas field ... does not exist"); a write starts from `unset` there instead (int32's smallest: a
        write that leaves it so is refused). A null is an accessor error, a 500 either way."""
        spec_path = self.scale_paths["specReplicasPath"].strip(".").split(".")
        replicas = _nested(obj, spec_path)
        if replicas is _MISSING:
            if unset is None:
                raise ApiError(500, "InternalError", f"the spec replicas field "
                               f"\"{self.scale_paths['specReplicasPath']}\" does not exist")  # fmt: skip
            replicas = unset
        elif not isinstance(replicas, int) or isinstance(replicas, bool):
            raise ApiError(
                500,
                "InternalError",
                f"{self.scale_paths['specReplicasPath']} accessor error: "
                f"{replicas!r} is of the type {type(replicas).__name__}, expected int64",
            )
        status_replicas = _nested(obj, self.scale_paths["statusReplicasPath"].strip(".").split("."))
        selector = _nested(obj, self.scale_paths["labelSelectorPath"].strip(".").split("."))
        meta = obj["metadata"]
        return {"apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"],
                             "resourceVersion": meta["resourceVersion"]},
                "spec": {"replicas": replicas},
                "status": {"replicas": 0 if status_replicas is _MISSING else status_replicas,
                           "selector": "" if selector is _MISSING else selector}}  # fmt: skip

    def _rescale(self, group: str, resource: str, ns: str, name: str, current: dict[str, Any], body: Any,
                 verb: str, content_type: str) -> dict[str, Any]:  # fmt: skip
        unset = -2147483648
        scale = body if verb == "update" else self._patched(self._scale(current, unset), body, content_type)
        replicas = (scale.get("spec") or {}).get("replicas")
        if replicas in (None, unset):
            raise ApiError(400, "BadRequest", f"the spec replicas field \"{self.scale_paths['specReplicasPath']}\" "
                           "cannot be empty")  # fmt: skip
        wanted = copy.deepcopy(current)
        wanted["spec"]["replicas"] = replicas
        wanted["metadata"]["resourceVersion"] = (scale.get("metadata") or {}).get("resourceVersion") or None
        self._write(group, resource, ns, name, wanted, None)
        return self._scale(self._get(group, resource, ns, name))

    def watch(self, group: str, resource: str, ns: str | None, query: dict[str, list[str]],
              admin: bool = False) -> Iterator[dict[str, Any]]:  # fmt: skip
        """The events of a watch, as the server streams them, until `timeoutSeconds` or the server stops;
        the controller's watch goes silent in a blackhole, and is dropped (`Dropped`) when it ends.

        The lock is held only to collect events, never while the caller writes them to the socket.
        """
        label_selector = query.get("labelSelector", [""])[0]
        field_selector = query.get("fieldSelector", [""])[0]
        bookmarks = query.get("allowWatchBookmarks", ["false"])[0].lower() in ("true", "1")
        deadline = time.monotonic() + float(query.get("timeoutSeconds", ["60"])[0])
        start = query.get("resourceVersion", [""])[0]
        kind = KINDS[(group, resource)]

        def wanted(obj: dict[str, Any]) -> bool:
            return (ns is None or obj["metadata"]["namespace"] == ns) and self._selected(
                obj, label_selector, field_selector
            )

        with self.lock:
            generation = self._watch_generation
            if start in ("", "0"):  # "from now", beginning with what exists, as ADDED
                seen = self.revision
                batch = [{"type": "ADDED", "object": copy.deepcopy(o)}
                         for o in self.objects[(group, resource)].values() if wanted(o)]  # fmt: skip
            elif int(start) < self.compacted_before - 1:
                gone = ApiError(410, "Expired", f"too old resource version: {start} ({self.compacted_before - 1})")
                batch, seen = [{"type": "ERROR", "object": gone.status()}], -1
            else:
                seen, batch = int(start), []
        yield from batch
        last_bookmark = time.monotonic()
        while seen >= 0:
            if not admin and not self.answering.is_set():
                self._hold()
                raise Dropped("the server stops")
            with self.lock:
                if self._stopped or generation != self._watch_generation:
                    return
                batch = []
                for revision, egroup, eresource, event_type, obj in self.history:
                    if revision > seen and (egroup, eresource) == (group, resource):
                        seen = revision
                        if wanted(obj):
                            batch.append({"type": event_type, "object": copy.deepcopy(obj)})
                now = time.monotonic()
                if not batch and bookmarks and now - last_bookmark >= self.bookmark_seconds:
                    last_bookmark, seen = now, max(seen, self.revision)
                    batch = [{"type": "BOOKMARK", "object": {"kind": kind.kind, "apiVersion": kind.api_version,
                                                             "metadata": {"resourceVersion": str(seen)}}}]  # fmt: skip
                if not batch:
                    if now >= deadline:
                        return
                    self.changed.wait(timeout=max(min(deadline - now, self.bookmark_seconds, 0.5), 0.01))
            yield from batch


_MISSING = object()


def _nested(obj: Any, path: list[str]) -> Any:
    for part in path:
        if not isinstance(obj, dict) or part not in obj:
            return _MISSING
        obj = obj[part]
    return obj


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.open: set[socket.socket] = set()
        self.open_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.open_lock:
            self.open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.open_lock:
            self.open.discard(request)
        super().shutdown_request(request)

    def drop_all(self) -> None:
        """Close every open connection for reading and writing: the client reads an end with no answer (a
        watch: a stream cut mid-chunk), and the handler's next write fails."""
        with self.open_lock:
            connections = list(self.open)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up on a kept-alive connection or a watch is no error of the server's."""


class _Handler(BaseHTTPRequestHandler):
    fake: FakeApiServer
    protocol_version = "HTTP/1.1"  # keep-alive, and chunked watch streams
    disable_nagle_algorithm = True  # as Go's server: no 40 ms delayed-ACK stall on every small response

    def log_message(self, *args: Any) -> None:
        pass

    def _serve(self) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        admin = self.headers.get("Authorization", "") == f"Bearer {ADMIN_TOKEN}"
        if not admin and not self.fake.answering.is_set():  # blackholed: read, never answered
            self.fake._hold()
            self._drop()
            return
        fault = self.fake._draw_fault(admin)
        if fault == "reset":
            self._drop()
            return
        try:
            if isinstance(fault, int):
                raise ApiError(fault, {409: "Conflict", 429: "TooManyRequests", 503: "ServiceUnavailable"}.get(
                    fault, "InternalError"), f"injected {fault} (random faults)")  # fmt: skip
            body = json.loads(raw) if raw else None
            result = self.fake.handle(self.command, url.path, query, body, self.headers.get("Content-Type", ""), admin)
            code = 201 if self.command == "POST" else 200
        except ApiError as err:
            result, code = err.status(), err.code
        if fault == "lost":  # carried out; the answer never arrives
            self._drop()
            return
        if self.command == "GET" and code == 200 and query.get("watch", ["false"])[0].lower() in ("true", "1"):
            self._stream(url.path, query, admin)
            return
        data = json.dumps(result).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _drop(self) -> None:
        """End the connection with no (further) answer."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _stream(self, path: str, query: dict[str, list[str]], admin: bool) -> None:
        """A watch: one JSON event per line, in HTTP/1.1 chunks as kube-apiserver sends them (older clients
        read a watch with `read_chunked` and see nothing of a plain stream)."""
        match = PATH.match(path)
        assert match is not None
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for event in self.fake.watch(match["group"] or "", match["res"], match["ns"], query, admin):
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except Dropped:
            self._drop()
        except OSError:  # the client went, or reset_connections() closed it
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve


def rbac_allows(rbac_docs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """Every (apiGroup, resource, verb) the ClusterRole and Roles of manifests/rbac.yaml grant."""
    allowed = set()
    for doc in rbac_docs:
        if doc and doc.get("kind") in ("ClusterRole", "Role"):
            for rule in doc.get("rules", []):
                for group in rule.get("apiGroups", []):
                    for resource in rule.get("resources", []):
                        allowed.update((group, resource, verb) for verb in rule.get("verbs", []))
    return allowed
