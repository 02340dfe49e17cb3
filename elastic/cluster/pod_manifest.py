"""The pod of one worker, built from the job's spec (pure: no API call).

spec.worker.template, if any, with what the controller owns on top: the `worker` container's command,
image and env, the `elastic.dev/` labels that let a restarted controller adopt its pods, the job as owner,
the tracking finalizer and `restartPolicy: Never`; defaults that keep a pod with no template within the
`restricted` Pod Security Standard (but runAsNonRoot); the controller's etcd credentials by reference to a
Secret, never by value. `kubernetes.py` sends what this builds.
"""

from __future__ import annotations

import copy
import json
import sys
from typing import Any

from kubernetes.client import ApiException

from elastic.cluster.base import WorkerLaunch, WorkerStartError
from elastic.spec import ElasticJob, PodTemplate

STOP_GRACE_SECONDS = 15
CONTAINER = "worker"
JOB_LABEL = "elastic.dev/job"
WORKER_LABEL = "elastic.dev/worker"
INCARNATION_LABEL = "elastic.dev/incarnation"
TRACKING_FINALIZER = "elastic.dev/worker-tracking"
# What the `restricted` Pod Security Standard asks of a container, less runAsNonRoot: many training images
# run as root, and a pod that cannot start is worse than one a restricted namespace refuses with a reason.
CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}

def job_selector(job_name: str) -> str:
    return f"{JOB_LABEL}={job_name}"


def owner_reference(job: ElasticJob) -> dict[str, Any]:
    """The ElasticJob as the pod's controller: deleting the job deletes its pods (garbage collection), and
    a foreground deletion of the job waits for them (blockOwnerDeletion; RBAC grants elasticjobs/finalizers).
    """
    return {
        "apiVersion": job.api_version,
        "kind": job.kind,
        "name": job.metadata.name,
        "uid": job.metadata.uid or "",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def disruption_budget(job: ElasticJob) -> dict[str, Any]:
    """The job's PodDisruptionBudget (spec.podDisruptionBudget): minReplicas of its worker pods stay through
    a drain, owned by the job so that it goes with it (pure)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": job.metadata.name, "namespace": job.metadata.namespace,
                     "labels": {JOB_LABEL: job.metadata.name}, "ownerReferences": [owner_reference(job)]},
        "spec": {"minAvailable": job.spec.min_replicas, "selector": {"matchLabels": {JOB_LABEL: job.metadata.name}}},
    }  # fmt: skip


def owned_by(pod: dict[str, Any], uid: str | None) -> bool:
    """Whether the pod's controller is the job with this uid. A job deleted and re-created under the same
    name has a new uid: the old one's pods (still terminating) are not its workers."""
    return any(
        ref.get("controller") and ref.get("uid") == (uid or "") for ref in pod["metadata"].get("ownerReferences") or []
    )


def pod_command(command: list[str]) -> list[str]:
    """The launch command as the image runs it: this machine's interpreter path becomes `python`."""
    result = ["python" if part == sys.executable else part for part in command]
    # In a pod the agent must advertise the pod's own address, not loopback (the downward API sets POD_IP).
    return ["--local-addr=$(POD_IP)" if part.startswith("--local-addr=") else part for part in result]


def secured(context: dict[str, Any] | None, pod_context: dict[str, Any] | None = None) -> dict[str, Any]:
    """A container's securityContext with CONTAINER_SECURITY filled in where it is silent (pure).

    Key by key: what the template says wins, whole (a `capabilities: {add: [IPC_LOCK]}` is the user's
    capabilities, not ours plus theirs). Two defaults the API server would refuse next to what was written
    are left out: `allowPrivilegeEscalation: false` beside `privileged: true` or an added SYS_ADMIN, and a
    container seccompProfile where the pod's securityContext sets one (the container's would override it).
    """
    result = copy.deepcopy(context or {})
    added = {cap.upper().removeprefix("CAP_") for cap in (result.get("capabilities") or {}).get("add") or []}
    if not result.get("privileged") and "SYS_ADMIN" not in added:
        result.setdefault("allowPrivilegeEscalation", CONTAINER_SECURITY["allowPrivilegeEscalation"])
    result.setdefault("capabilities", copy.deepcopy(CONTAINER_SECURITY["capabilities"]))
    if "seccompProfile" not in (pod_context or {}):
        result.setdefault("seccompProfile", copy.deepcopy(CONTAINER_SECURITY["seccompProfile"]))
    return result


def grace_seconds(job: ElasticJob) -> int:
    """How long a stopped worker gets between SIGTERM and SIGKILL: the template's
    terminationGracePeriodSeconds (time to write a checkpoint), else STOP_GRACE_SECONDS."""
    template = job.spec.worker.template
    grace = template.spec.get("terminationGracePeriodSeconds") if template else None
    return grace if isinstance(grace, int) and not isinstance(grace, bool) and grace >= 0 else STOP_GRACE_SECONDS


# The controller's own etcd credentials never go into a Pod object (anyone who can read pods would read
# them): a worker pod gets them from a Secret in its own namespace, files mounted, values by reference.
ETCD_SECRET_MOUNT = "/etc/elastic/etcd"
ETCD_SECRET_FILES = {"ELASTIC_ETCD_CACERT": "ca.crt", "ELASTIC_ETCD_CERT": "tls.crt", "ELASTIC_ETCD_KEY": "tls.key"}
ETCD_SECRET_VALUES = {"ELASTIC_ETCD_USER": "username", "ELASTIC_ETCD_PASSWORD": "password"}


def etcd_credentials(launch: WorkerLaunch, secret: str | None) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The worker's etcd TLS/auth settings as env entries and the Secret volume they come from (pure).

    Only the settings the controller itself uses are asked of the Secret (`secret`, in the pod's namespace,
    with keys ca.crt, tls.crt, tls.key, username, password). None when the controller uses none."""
    wanted = [name for name in (*ETCD_SECRET_FILES, *ETCD_SECRET_VALUES) if launch.env.get(name)]
    if not wanted:
        return [], None
    if not secret:
        raise WorkerStartError(
            f"worker {launch.name} could not be started: the controller's etcd needs TLS or a password "
            f"({', '.join(wanted)}), and worker pods get them only from a Secret in their namespace: set "
            "ELASTIC_WORKER_ETCD_SECRET on the controller (see README 'TLS and auth on Kubernetes')"
        )
    env = [
        {"name": name, "value": f"{ETCD_SECRET_MOUNT}/{ETCD_SECRET_FILES[name]}"}
        if name in ETCD_SECRET_FILES
        else {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": ETCD_SECRET_VALUES[name]}}}
        for name in wanted
    ]
    return env, {"name": "elastic-etcd", "secret": {"secretName": secret}}


def pod_manifest(
    job: ElasticJob, namespace: str, launch: WorkerLaunch, incarnation: int, etcd_secret: str | None = None
) -> dict[str, Any]:
    """The pod for one worker (pure): spec.worker.template, if any, with what the controller owns on top.

    Owned (always the controller's): the `worker` container's name, command (the agent), image (from
    spec.worker.image, else the template's worker container) and the env the controller sets (a template
    variable of the same name gives way), the pod's name, namespace, `elastic.dev/` labels, owner reference,
    tracking finalizer and `restartPolicy: Never`. Defaults (only where the template is silent):
    `automountServiceAccountToken: false` (a training process needs no API access; a template that wants
    the token says `true`), `terminationGracePeriodSeconds` 15, and `secured()` for every container, init
    containers included, so a pod with no template runs where the `restricted` standard asks for all but
    runAsNonRoot. The worker container comes first, so `kubectl logs` without `-c` shows it.
    """
    worker = job.spec.worker
    template = worker.template or PodTemplate()
    spec = copy.deepcopy(template.spec)
    base = template.worker_container()
    image = worker.image or base.get("image")
    if not image:
        raise WorkerStartError(
            f"worker {launch.name} could not be started: spec.worker.image (or an image on the template's worker "
            "container) is required to run workers on Kubernetes"
        )
    credentials, secret_volume = etcd_credentials(launch, etcd_secret)
    plain = {k: v for k, v in launch.env.items() if k not in ETCD_SECRET_FILES and k not in ETCD_SECRET_VALUES}
    ours = [{"name": k, "value": v} for k, v in {**plain, "ELASTIC_WORKER": launch.name}.items()]
    ours += credentials
    ours.append({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    ours.append({"name": "PYTHONUNBUFFERED", "value": "1"})
    owned = {var["name"] for var in ours}
    theirs = [var for var in base.get("env") or [] if not isinstance(var, dict) or var.get("name") not in owned]
    pod_context = spec.get("securityContext")
    container: dict[str, Any] = {
        **copy.deepcopy(base),
        "name": CONTAINER,
        "image": image,
        "command": pod_command(launch.command),
        "env": [*copy.deepcopy(theirs), *ours],
        "securityContext": secured(base.get("securityContext"), pod_context),
    }
    if worker.resources:
        container["resources"] = worker.resources
    if secret_volume is not None:
        spec["volumes"] = [*(spec.get("volumes") or []), secret_volume]
        mount = {"name": secret_volume["name"], "mountPath": ETCD_SECRET_MOUNT, "readOnly": True}
        container["volumeMounts"] = [*(container.get("volumeMounts") or []), mount]
    if launch.working_dir and launch.working_dir.startswith("/"):
        container["workingDir"] = launch.working_dir
    sidecars = [{**c, "securityContext": secured(c.get("securityContext"), pod_context)}
                for c in spec.get("containers") or [] if c["name"] != CONTAINER]  # fmt: skip
    spec["containers"] = [container, *sidecars]
    if spec.get("initContainers"):
        spec["initContainers"] = [{**c, "securityContext": secured(c.get("securityContext"), pod_context)}
                                  for c in spec["initContainers"]]  # fmt: skip
    spec["restartPolicy"] = "Never"
    spec.setdefault("terminationGracePeriodSeconds", STOP_GRACE_SECONDS)
    spec.setdefault("automountServiceAccountToken", False)
    metadata: dict[str, Any] = {
        "name": launch.name,
        "namespace": namespace,
        "labels": {
            **template.metadata.labels,
            JOB_LABEL: job.metadata.name,
            WORKER_LABEL: launch.name,
            INCARNATION_LABEL: str(incarnation),
        },
        "ownerReferences": [owner_reference(job)],
        "finalizers": [TRACKING_FINALIZER],
    }
    if template.metadata.annotations:
        metadata["annotations"] = dict(template.metadata.annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def refused_pod(err: ApiException, worker: str) -> WorkerStartError | None:
    """A create the API server refused for the pod itself, as the job's failure (WorkerStartFailed), else None.

    422 (an invalid pod: a misspelt or wrong-typed field of spec.worker.template), 400, and a 403 from Pod
    Security admission will be refused again for every worker: retrying forever would leave the job
    Created with nothing said. Any other 403 is the controller's RBAC, not the job's: it is raised.
    """
    body = err.body.decode(errors="replace") if isinstance(err.body, bytes) else str(err.body or "")
    try:
        message = json.loads(body).get("message") or body
    except (ValueError, AttributeError):
        message = body
    if err.status in (400, 422) or (err.status == 403 and "violates PodSecurity" in message):
        return WorkerStartError(f"worker {worker} could not be started: the API server refused its pod: {message}")
    return None
