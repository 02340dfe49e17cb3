"""A worker pod as the controller sees it: one pod (the API's JSON) -> one WorkerObservation (pure).

A pending or running pod is alive (ready, or waiting on something a user must see); a terminal one reports
the exit code of its `worker` container (or of the init container that failed) and the platform's reason
(OOMKilled, Evicted, DisruptionTarget, NodeLost, InitContainerFailed). `kubernetes.py` lists the pods.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from elastic.cluster.base import WorkerObservation
from elastic.cluster.pod_manifest import CONTAINER, WORKER_LABEL
from elastic.policy.incident import NODE_LOST

TERMINAL_PHASES = ("Succeeded", "Failed")
# DisruptionTarget condition reasons that mean the node went away rather than a preemption or eviction.
_NODE_GONE_DISRUPTIONS = {"DeletionByTaintManager", "DeletionByPodGC"}
_NODE_LOST_POD_REASONS = {"NodeLost", "UnexpectedAdmissionError"}


def parse_time(text: str | None) -> float:
    """An API timestamp (RFC 3339) as epoch seconds; 0.0 when absent (a start time unknown, never judged late)."""
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
    scheduled = [c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"]
    gates = [g.get("name", "") for g in pod.get("spec", {}).get("schedulingGates") or []]
    if gates or any(c.get("reason") == "SchedulingGated" for c in scheduled):
        # held by a scheduling gate (Kueue admits it when there is quota): waiting for capacity, not failing
        return f"SchedulingGated: {', '.join(gates)}".rstrip(": ")
    for condition in scheduled:
        if condition.get("reason") == "Unschedulable":
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
    started_at = parse_time(metadata.get("creationTimestamp"))
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
