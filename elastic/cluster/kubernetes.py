"""Workers as Kubernetes pods: one pod per worker, owned by its ElasticJob, observed by listing its pods.

Every `observe()` lists the job's pods by label (level-triggered: what the API server says now, nothing
cached that could drift), and maps each pod to a `WorkerObservation`: a pending or running pod is alive; a
terminal one reports the exit code of its `worker` container and a platform reason (OOMKilled, Evicted,
DisruptionTarget, NodeLost). A pod that vanished without the controller asking (node gone, garbage
collected, deleted by hand) is reported as ended with reason NodeLost and no exit code.

A controller restarted (or a new leader) adopts the pods it finds: their names, start times and
incarnations live in the pods' own labels, so nothing needs to be remembered between controllers.

Every pod carries a tracking finalizer (as the Job controller's pods do): a drain, an API eviction or a
preemption deletes the pod, and without the finalizer it could vanish between two observations and be
taken for a lost node (charged). With it, the pod stays, terminal and marked for deletion, until its end
was observed and handled (`forget`), so a DisruptionTarget is seen as one and is free by default. A pod
whose node stopped reporting (phase Unknown) is deleted gracefully, never forced: its container may still
run. Worker pods get no service-account token and a security context that drops every capability, forbids
privilege escalation and uses the runtime's default seccomp profile, where spec.worker.template (the pod
template every worker pod starts from) does not say otherwise. A pod whose init container failed ends with
that container's exit code and the reason InitContainerFailed; a pod the API server refuses (invalid, or
against the namespace's Pod Security) fails its job as WorkerStartFailed instead of being retried forever.

Only the verbs in manifests/rbac.yaml are used: pods create/list/delete/patch (patch only takes the
tracking finalizer off).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from kubernetes.client import ApiException, CoreV1Api

from elastic.cluster.base import WorkerLaunch, WorkerObservation, WorkerStartError
from elastic.spec import ElasticJob, PodTemplate

log = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 15
EXPECTATION_SECONDS = 30.0  # how long a created pod may be missing from the informer's cache
CONTAINER = "worker"
JOB_LABEL = "elastic.dev/job"
WORKER_LABEL = "elastic.dev/worker"
INCARNATION_LABEL = "elastic.dev/incarnation"
NODE_LOST = "NodeLost"
TRACKING_FINALIZER = "elastic.dev/worker-tracking"
TERMINAL_PHASES = ("Succeeded", "Failed")
# What the `restricted` Pod Security Standard asks of a container, less runAsNonRoot: many training images
# run as root, and a pod that cannot start is worse than one a restricted namespace refuses with a reason.
CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
# DisruptionTarget condition reasons that mean the node went away rather than a preemption or eviction.
_NODE_GONE_DISRUPTIONS = {"DeletionByTaintManager", "DeletionByPodGC"}
_NODE_LOST_POD_REASONS = {"NodeLost", "UnexpectedAdmissionError"}


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


def _parse_time(text: str | None) -> float:
    if not text:
        return 0.0
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _worker_terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    for status in pod.get("status", {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            state = status.get("state") or {}
            return state.get("terminated") or (status.get("lastState") or {}).get("terminated")
    return None


INIT_CONTAINER_FAILED = "InitContainerFailed"


def _failed_init(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The terminated state of the first init container that ended non-zero, if the worker never ran.

    With restartPolicy Never the kubelet does not retry an init container: the pod goes Failed and the
    worker container stays waiting (PodInitializing), with no exit code of its own to classify.
    """
    if _worker_terminated(pod) is not None:
        return None
    for status in pod.get("status", {}).get("initContainerStatuses") or []:
        state = status.get("state") or {}
        terminated = state.get("terminated") or (status.get("lastState") or {}).get("terminated") or {}
        if terminated.get("exitCode"):
            return terminated
    return None


def exit_reason(pod: dict[str, Any]) -> str | None:
    """The platform's reason for a pod's end, most specific first (pure).

    An init container that failed is `InitContainerFailed` (its exit code is the worker's, see observe_pod),
    so a rule can tell a setup step failing from training failing (`onReasons: [InitContainerFailed]`),
    unless the platform ended it: eviction, node loss and preemption kill init containers too and name
    the real cause; an init container killed for memory is `OOMKilled` like the worker.
    """
    status = pod.get("status", {})
    terminated = _worker_terminated(pod) or _failed_init(pod) or {}
    if terminated.get("reason") == "OOMKilled":
        return "OOMKilled"
    if status.get("reason") == "Evicted":
        return "Evicted"
    if status.get("reason") in _NODE_LOST_POD_REASONS or status.get("phase") == "Unknown":
        return NODE_LOST
    for condition in status.get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            return NODE_LOST if condition.get("reason") in _NODE_GONE_DISRUPTIONS else "DisruptionTarget"
    if _failed_init(pod) is not None:
        return INIT_CONTAINER_FAILED
    return None


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


# Why a pod that should be running is not: what a user must see instead of a job stuck "Created".
# CrashLoopBackOff: only a native sidecar (an init container with restartPolicy Always) can loop in a
# restartPolicy Never pod, and a pod waiting on one never starts its worker.
STUCK_REASONS = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "CreateContainerConfigError",
                           "CreateContainerError", "RunContainerError", "CrashLoopBackOff",
                           "Unschedulable"})  # fmt: skip


def waiting_reason(pod: dict[str, Any]) -> str | None:
    """The reason a pending pod does not run, with the message Kubernetes gives (pure): the worker or an
    init container waiting on its image or config, or the scheduler finding no node."""
    status = pod.get("status", {})
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return f"Unschedulable: {condition.get('message', '')}".rstrip(": ")
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_REASONS:
            return f"{waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
    return None


def _worker_ended(pod: dict[str, Any]) -> bool:
    """The worker container has terminated, whatever the pod's phase: a template's sidecar (a plain container,
    not a native sidecar, i.e. an init container with restartPolicy Always) keeps the pod Running after
    training ended, and the worker's end must be seen then, not when someone stops the sidecar."""
    for status in pod.get("status", {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            return bool((status.get("state") or {}).get("terminated"))
    return False


def observe_pod(pod: dict[str, Any], stopping: bool) -> WorkerObservation:
    """One pod (as the API returns it, camelCase JSON) as a worker observation (pure)."""
    metadata, status = pod["metadata"], pod.get("status", {})
    name = metadata.get("labels", {}).get(WORKER_LABEL, metadata["name"])
    started_at = _parse_time(metadata.get("creationTimestamp"))
    phase = status.get("phase", "Pending")
    never_ran = bool(metadata.get("deletionTimestamp")) and not pod.get("spec", {}).get("nodeName")
    if phase in ("Pending", "Running") and not never_ran and not _worker_ended(pod):
        # (deleted before it was scheduled: it never runs; its worker ended: a sidecar may keep the pod Running)
        ready, waiting, pending = _ready(pod), waiting_reason(pod), phase == "Pending"
        return WorkerObservation(name, True, None, None, started_at, stopping, ready=ready, waiting=waiting,
                                 pending=pending)  # fmt: skip
    terminated = _worker_terminated(pod) or _failed_init(pod)
    code = terminated.get("exitCode") if terminated else None
    return WorkerObservation(name, False, code, exit_reason(pod), started_at, stopping)


class KubernetesWorkers:
    """The WorkerSet of one ElasticJob on Kubernetes."""

    def __init__(
        self,
        core_api: CoreV1Api,
        job: ElasticJob,
        namespace: str | None = None,
        pods: Callable[[], list[dict[str, Any]]] | None = None,
        etcd_secret: str | None = None,
    ) -> None:
        """`pods`: every worker pod the controller's informer holds (its cache, no API request); None: list
        this job's pods from the API server at each observation (tests, tools). `etcd_secret`: the Secret of
        the job's namespace that gives worker pods the etcd TLS/auth settings the controller uses."""
        self.etcd_secret = etcd_secret
        self.api = core_api
        self.job = job
        self.pods = pods
        self.namespace = namespace or job.metadata.namespace
        self.selector = job_selector(job.metadata.name)
        self.grace = grace_seconds(job)
        self._known: dict[str, float] = {}  # worker -> started_at, for pods that vanish
        self._expected: dict[str, float] = {}  # created here, not seen listed yet -> when (monotonic)
        self._stopping: set[str] = set()
        self._forgotten: set[str] = set()  # forgotten workers whose pods may still be listed while deleted
        self._incarnation = 0
        for pod in self._list():
            self._adopt(pod)
            # Being deleted when this controller took over: an earlier controller's stop, unless the
            # platform is evicting or preempting it (then its end is a failure to classify).
            if pod["metadata"].get("deletionTimestamp") and exit_reason(pod) is None:
                self._stopping.add(self._name_of(pod))

    @staticmethod
    def _name_of(pod: dict[str, Any]) -> str:
        return pod["metadata"].get("labels", {}).get(WORKER_LABEL, pod["metadata"]["name"])

    def _list(self) -> list[dict[str, Any]]:
        """This job's pods: selected by label, kept only if this job (this uid) is their controller."""
        if self.pods is not None:
            listed = [p for p in self.pods() if p["metadata"].get("namespace") == self.namespace]
        else:
            response = self.api.list_namespaced_pod(
                self.namespace, label_selector=self.selector, _preload_content=False
            )
            listed = json.loads(response.data).get("items") or []
        return [pod for pod in listed if owned_by(pod, self.job.metadata.uid)]

    def _adopt(self, pod: dict[str, Any]) -> None:
        labels = pod["metadata"].get("labels", {})
        self._known.setdefault(self._name_of(pod), _parse_time(pod["metadata"].get("creationTimestamp")))
        with contextlib.suppress(ValueError):
            self._incarnation = max(self._incarnation, int(labels.get(INCARNATION_LABEL, 0)))

    def start(self, launch: WorkerLaunch) -> None:
        self._incarnation += 1
        body = pod_manifest(self.job, self.namespace, launch, self._incarnation, self.etcd_secret)
        try:
            self.api.create_namespaced_pod(self.namespace, body, _preload_content=False)
        except ApiException as err:
            refused = refused_pod(err, launch.name)
            if refused is not None:
                raise refused from None
            existing = self._get(launch.name) if err.status == 409 else None
            if existing is None or not owned_by(existing, self.job.metadata.uid):
                raise
            log.info("pod %s/%s exists already (an earlier create went through): adopted", self.namespace, launch.name)
        self._known[launch.name] = time.time()
        self._expected[launch.name] = time.monotonic()
        self._forgotten.discard(launch.name)
        log.info("created pod %s/%s (incarnation %d)", self.namespace, launch.name, self._incarnation)

    def observe(self) -> list[WorkerObservation]:
        result, seen = [], set()
        for pod in self._list():
            observation = observe_pod(pod, False)
            if observation.name in self._forgotten:
                continue
            self._adopt(pod)
            seen.add(observation.name)
            stopping = observation.name in self._stopping
            started_at = observation.started_at or self._known[observation.name]
            result.append(dataclasses.replace(observation, started_at=started_at, stopping=stopping))
        for name, started_at in self._known.items():
            if name in seen:
                self._expected.pop(name, None)
            elif self._awaited(name):  # created, not in the informer's cache yet: pending, not lost
                result.append(WorkerObservation(name, True, None, None, started_at, False, ready=False))
            else:  # gone: deleted as asked, or lost with its node
                stopping = name in self._stopping
                result.append(
                    WorkerObservation(name, False, None, None if stopping else NODE_LOST, started_at, stopping)
                )
        return result

    def _awaited(self, name: str) -> bool:
        """A pod this controller created that the cache has not shown yet (client-go's "expectations"): a
        watch delivers it a moment after the create; only past EXPECTATION_SECONDS is it taken for lost."""
        created = self._expected.get(name)
        cached = self.pods is not None  # a list straight from the API server shows every pod it created
        return cached and created is not None and time.monotonic() - created < EXPECTATION_SECONDS

    def _delete(self, name: str, grace: int) -> None:
        try:
            self.api.delete_namespaced_pod(name, self.namespace, grace_period_seconds=grace, _preload_content=False)
        except ApiException as err:
            if err.status != 404:
                raise

    def stop(self, name: str) -> None:
        """Delete the pod: the kubelet sends SIGTERM (torch's agent stops its workers), SIGKILL after the
        pod's grace period (15 s, or the template's terminationGracePeriodSeconds)."""
        if name in self._stopping:
            return
        self._stopping.add(name)
        self._delete(name, self.grace)

    def forget(self, name: str) -> None:
        """The worker's end was handled: let its pod go (finalizer off, deleted) and stop reporting it.

        A terminal pod is deleted at once; one in phase Unknown gracefully (its node may come back with the
        container still running: only the kubelet, or the node's removal, may end it).
        """
        self._known.pop(name, None)
        self._stopping.discard(name)
        self._forgotten.add(name)
        pod = self._get(name)
        if pod is None:
            return
        self._release(pod)
        terminal = pod.get("status", {}).get("phase") in TERMINAL_PHASES
        self._delete(name, 0 if terminal else self.grace)

    def _get(self, name: str) -> dict[str, Any] | None:
        try:
            response = self.api.read_namespaced_pod(name, self.namespace, _preload_content=False)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return json.loads(response.data)

    def _release(self, pod: dict[str, Any], fresh: bool = True) -> None:
        """Take the tracking finalizer off (only ours: others' finalizers stay), if the pod has it."""
        finalizers, tracking = pod["metadata"].get("finalizers") or [], TRACKING_FINALIZER
        if tracking not in finalizers:
            return
        # A JSON patch (a list body is one for every client version): a strategic merge patch would *add* to
        # finalizers (their patch strategy is merge); the test makes it apply to the pod as read only.
        patch = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": pod["metadata"]["resourceVersion"]},
            {"op": "replace", "path": "/metadata/finalizers", "value": [f for f in finalizers if f != tracking]},
        ]
        try:
            self.api.patch_namespaced_pod(pod["metadata"]["name"], self.namespace, patch, _preload_content=False)
        except ApiException as err:
            if err.status == 404:
                return
            if err.status not in (409, 422) or not fresh:
                raise
            current = self._get(pod["metadata"]["name"])  # changed since it was read (a cache lags): again
            if current is not None:
                self._release(current, fresh=False)

    def release_all(self) -> None:
        """The job is gone (deleted, or its pods orphaned): no finalizer of ours may keep its pods."""
        for pod in self._list():
            self._release(pod)

    def finish(self) -> None:
        """The job is final and none of its workers runs: delete every pod left (the succeeded ones).

        Called by whoever drives the JobController once `done()` (and after ttlSecondsAfterFinished).
        """
        for pod in self._list():
            name = pod["metadata"]["name"]
            self._forgotten.add(self._name_of(pod))
            self._release(pod)
            self._delete(name, 0 if pod.get("status", {}).get("phase") in TERMINAL_PHASES else self.grace)
        self._known.clear()
        self._stopping.clear()

    def close(self) -> None:
        """Nothing to release; the pods keep running for the next leader to adopt."""
