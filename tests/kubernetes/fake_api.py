"""A FAKE Kubernetes API server: exactly the paths the controller uses, JSON objects in memory.

This is not kube-apiserver (none can run on these machines). It serves, on 127.0.0.1, what the real
`kubernetes` client sends for pods (create, list by labelSelector, get, delete), events (create), leases
(get, create, replace with resourceVersion conflicts -> 409) and ElasticJobs (get, list, status and scale
subresources with merge patches). There is no scheduler and no kubelet: tests play the kubelet by setting
pod phases, exit codes and reasons in `FakeApiServer.pods` directly. Every request is recorded as an RBAC
(apiGroup, resource, verb) triple so that tests can compare them with manifests/rbac.yaml.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

CORE = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<res>pods|events)(?:/(?P<name>[^/]+))?$")
GROUPED = re.compile(
    r"^/apis/(?P<group>coordination\.k8s\.io|elastic\.dev)/(?P<version>v1|v1alpha1)/(?:namespaces/(?P<ns>[^/]+)/)?"
    r"(?P<res>leases|elasticjobs)(?:/(?P<name>[^/]+)(?:/(?P<sub>status|scale))?)?$"
)


def now_text() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": reason,
        "code": code,
        "message": message,
    }


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason = code, reason


class FakeApiServer:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[tuple[str, str, str]] = []  # (apiGroup, resource, verb)
        self.deletions: list[tuple[str, int | None]] = []  # (pod name, gracePeriodSeconds)
        self.patch_types: list[str] = []
        self._versions = itertools.count(1)
        self.fail_leases = False  # simulate an API server unreachable for lease calls
        handler = type("Handler", (_Handler,), {"fake": self})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> FakeApiServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _version(self) -> str:
        return str(next(self._versions))

    # --- the test's own access (the "kubelet", the user) ---

    def add_job(self, job: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            stored = json.loads(json.dumps(job))
            meta = stored.setdefault("metadata", {})
            meta.setdefault("namespace", "default")
            meta.setdefault("uid", str(uuid.uuid4()))
            meta["resourceVersion"] = self._version()
            self.jobs[(meta["namespace"], meta["name"])] = stored
            return stored

    def pods_of(self, job: str, namespace: str = "default") -> dict[str, dict[str, Any]]:
        with self.lock:
            return {
                name: pod for (ns, name), pod in self.pods.items()
                if ns == namespace and pod["metadata"].get("labels", {}).get("elastic.dev/job") == job
            }  # fmt: skip

    def set_pod(
        self,
        name: str,
        phase: str,
        exit_code: int | None = None,
        container_reason: str | None = None,
        reason: str | None = None,
        conditions: list[dict[str, Any]] | None = None,
        namespace: str = "default",
    ) -> None:
        """Play the kubelet: the pod's phase, its worker container's end, the pod's reason/conditions."""
        with self.lock:
            pod = self.pods[(namespace, name)]
            status: dict[str, Any] = {"phase": phase}
            if phase == "Running":
                status["containerStatuses"] = [{"name": "worker", "state": {"running": {"startedAt": now_text()}}}]
            if exit_code is not None:
                terminated = {
                    "exitCode": exit_code,
                    "reason": container_reason or ("Completed" if exit_code == 0 else "Error"),
                }
                status["containerStatuses"] = [{"name": "worker", "state": {"terminated": terminated}}]
            if reason:
                status["reason"] = reason
            if conditions:
                status["conditions"] = conditions
            pod["status"] = status
            pod["metadata"]["resourceVersion"] = self._version()

    def events_for(self, job: str) -> list[dict[str, Any]]:
        with self.lock:
            return [e for e in self.events if e["involvedObject"]["name"] == job]

    # --- the API ---

    def handle(self, method: str, path: str, query: dict[str, list[str]], body: Any, content_type: str) -> Any:
        with self.lock:
            match = CORE.match(path)
            if match:
                group, sub = "", None
            else:
                match = GROUPED.match(path)
                if not match:
                    raise ApiError(404, "NotFound", f"the fake serves no {path}")
                group, sub = match["group"], match["sub"]
            ns, res, name = match["ns"], match["res"], match["name"]
            verb = {"GET": "get" if name else "list", "POST": "create", "PUT": "update", "PATCH": "patch",
                    "DELETE": "delete"}[method]  # fmt: skip
            self.requests.append((group, f"{res}/{sub}" if sub else res, verb))
            if method == "PATCH":
                self.patch_types.append(content_type)
            handler = getattr(self, f"_{res}")
            return handler(verb, ns, name, sub, query, body)

    def _pods(self, verb: str, ns: str, name: str | None, sub: None, query: dict, body: Any) -> Any:
        if verb == "create":
            name = body["metadata"]["name"]
            if (ns, name) in self.pods:
                raise ApiError(409, "AlreadyExists", f'pods "{name}" already exists')
            pod = json.loads(json.dumps(body))
            pod["metadata"].update(
                {
                    "namespace": ns,
                    "uid": str(uuid.uuid4()),
                    "creationTimestamp": now_text(),
                    "resourceVersion": self._version(),
                }
            )
            pod["status"] = {"phase": "Pending"}
            self.pods[(ns, name)] = pod
            return pod
        if verb == "list":
            wanted = dict(
                part.split("=", 1) for part in (query.get("labelSelector", [""])[0]).split(",") if "=" in part
            )
            items = [
                p for (pns, _), p in self.pods.items()
                if pns == ns and all(p["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
            ]  # fmt: skip
            return {
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": self._version()},
                "items": items,
            }
        pod = self.pods.get((ns, name))  # type: ignore[arg-type]
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{name}" not found')
        if verb == "delete":
            grace = query.get("gracePeriodSeconds", [None])[0]
            self.deletions.append((name, int(grace) if grace is not None else None))  # type: ignore[arg-type]
            del self.pods[(ns, name)]  # the fake deletes at once (no graceful termination)
        return pod

    def _events(self, verb: str, ns: str, name: str | None, sub: None, query: dict, body: Any) -> Any:
        if verb != "create":
            raise ApiError(405, "MethodNotAllowed", "the fake only creates events")
        event = json.loads(json.dumps(body))
        event["metadata"]["namespace"] = ns
        self.events.append(event)
        return event

    def _leases(self, verb: str, ns: str, name: str | None, sub: None, query: dict, body: Any) -> Any:
        if self.fail_leases:
            raise ApiError(503, "ServiceUnavailable", "lease calls fail (simulated outage)")
        if verb == "create":
            key = (ns, body["metadata"]["name"])
            if key in self.leases:
                raise ApiError(409, "AlreadyExists", f'leases "{key[1]}" already exists')
        else:
            key = (ns, name)  # type: ignore[assignment]
            if key not in self.leases:
                raise ApiError(404, "NotFound", f'leases "{name}" not found')
            if verb == "get":
                return self.leases[key]
            if verb != "update":
                raise ApiError(405, "MethodNotAllowed", verb)
            sent = body["metadata"].get("resourceVersion")
            if sent != self.leases[key]["metadata"]["resourceVersion"]:
                raise ApiError(
                    409, "Conflict", "the object has been modified; please apply your changes to the latest version"
                )
        lease = json.loads(json.dumps(body))
        lease["metadata"].update({"namespace": ns, "resourceVersion": self._version()})
        self.leases[key] = lease
        return lease

    def _elasticjobs(self, verb: str, ns: str, name: str | None, sub: str | None, query: dict, body: Any) -> Any:
        if verb == "list":
            items = [j for (jns, _), j in self.jobs.items() if ns is None or jns == ns]  # None: all namespaces
            return {"apiVersion": "elastic.dev/v1alpha1", "kind": "ElasticJobList", "metadata": {}, "items": items}
        job = self.jobs.get((ns, name))  # type: ignore[arg-type]
        if job is None:
            raise ApiError(404, "NotFound", f'elasticjobs.elastic.dev "{name}" not found')
        if sub == "scale":  # specReplicasPath .spec.replicas, statusReplicasPath .status.replicas.active
            if verb in ("update", "patch"):
                replicas = (body.get("spec") or {}).get("replicas")
                if replicas is not None:
                    job["spec"]["replicas"] = replicas
                    job["metadata"]["resourceVersion"] = self._version()
            status = job.get("status") or {}
            return {
                "apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": name, "namespace": ns, "resourceVersion": job["metadata"]["resourceVersion"]},
                "spec": {"replicas": job["spec"].get("replicas")},
                "status": {"replicas": (status.get("replicas") or {}).get("active", 0),
                           "selector": status.get("selector", "")},
            }  # fmt: skip
        if verb == "patch":
            patched = merge_patch(job, body)
            if sub == "status":  # the status subresource changes nothing but .status
                job["status"] = patched.get("status")
            else:
                job.update({k: v for k, v in patched.items() if k != "status"})
            job["metadata"]["resourceVersion"] = self._version()
        elif verb != "get":
            raise ApiError(405, "MethodNotAllowed", verb)
        return job


class _Handler(BaseHTTPRequestHandler):
    fake: FakeApiServer

    def log_message(self, *args: Any) -> None:
        pass

    def _serve(self) -> None:
        url = urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
            result, code = (
                self.fake.handle(
                    self.command, url.path, parse_qs(url.query), body, self.headers.get("Content-Type", "")
                ),
                200,
            )
            if self.command == "POST":
                code = 201
        except ApiError as err:
            result, code = _status(err.code, err.reason, str(err)), err.code
        data = json.dumps(result).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

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
