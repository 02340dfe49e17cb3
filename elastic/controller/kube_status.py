"""The ElasticJob's status on Kubernetes: the status subresource, and an Event per state change and charge.

The JobController computes the status dict (the same one it writes to etcd); `KubeStatus.publish` writes
it to the ElasticJob's status subresource with a JSON merge patch and emits core/v1 Events so that
`kubectl describe ej NAME` tells the job's story. Which events a change produces is decided by the pure
`events_for(previous, status)`.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any

from kubernetes.client import ApiException, CoreV1Api, CustomObjectsApi

from elastic.cluster.kubernetes import TRANSPORT_ERRORS
from elastic.cluster.pod_manifest import job_selector
from elastic.controller.status import FAILED, RESTARTING, WORKERS_WAITING, timestamp
from elastic.spec import ElasticJob
from elastic.spec.crd import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)

COMPONENT = "elastic-controller"
RESTARTED = "Restarted"
RECONCILE_ERROR = "ReconcileError"
NORMAL, WARNING = "Normal", "Warning"


@dataclass(frozen=True)
class JobEvent:
    type: str  # Normal or Warning
    reason: str
    message: str


def events_for(previous: dict[str, Any] | None, status: dict[str, Any]) -> list[JobEvent]:
    """The events one status change produces (pure): budget charges first, then the state change."""
    previous = previous or {}
    events: list[JobEvent] = []
    used_before = (previous.get("restarts") or {}).get("used", 0)
    restarts = status.get("restarts") or {}
    used, limit = restarts.get("used", 0), restarts.get("max", 0)
    last = status.get("lastFailure") or {}
    for n in range(used_before + 1, used + 1):
        cause = last.get("cause") if n == used else None
        where = f" in round {last['round']}" if n == used and "round" in last else ""
        text = f"restart {n}/{limit} charged" + (f": {cause}{where}" if cause else "")
        events.append(JobEvent(WARNING, RESTARTED, text))
    waiting = _condition(status, WORKERS_WAITING)
    if waiting.get("status") == "True" and waiting.get("reason") != _condition(previous, WORKERS_WAITING).get("reason"):
        events.append(JobEvent(WARNING, waiting["reason"], waiting.get("message", "")))
    state = (status.get("phase"), status.get("reason"), status.get("round"))
    before = (previous.get("phase"), previous.get("reason"), previous.get("round"))
    if status.get("phase") and state != before:
        kind = WARNING if status["phase"] in (FAILED, RESTARTING) else NORMAL
        message = f"{status['phase']}: {status.get('message', '')}".rstrip(": ")
        events.append(JobEvent(kind, status.get("reason") or status["phase"], message))
    return events


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})


class KubeStatus:
    """Writes one ElasticJob's status and events. `previous`: the status already on the object, if any."""

    def __init__(
        self,
        custom_api: CustomObjectsApi,
        core_api: CoreV1Api,
        job: ElasticJob,
        previous: dict[str, Any] | None = None,
        instance: str = COMPONENT,
    ) -> None:
        self.custom = custom_api
        self.core = core_api
        self.job = job
        self.last = previous
        self.generation = (previous or {}).get("observedGeneration")
        self.instance = instance

    def publish(self, status: dict[str, Any], generation: int | None = None) -> bool:
        """Write `status` if it changed since the last publish; True when something was written.

        `generation`: the object's metadata.generation the controller acted on, as observedGeneration.
        """
        if status == self.last and generation == self.generation:
            return False
        meta = self.job.metadata
        observed = {"observedGeneration": generation} if generation is not None else {}
        body = {"status": {**status, "selector": job_selector(meta.name), **observed}}
        try:
            # A merge patch: the client's default for a custom object's status in every version >= 29 (the
            # `_content_type` override exists only from 36 on).
            self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, meta.namespace, PLURAL, meta.name, body)
        except ApiException as err:
            if err.status != 404:
                raise
            log.warning("ElasticJob %s is gone; its status was not written", self.job.key)
        for event in events_for(self.last, status):
            self.emit(event)
        self.last, self.generation = status, generation
        return True

    def report_error(self, reason: str, message: str) -> None:
        """An API error while reconciling this job: a `ReconcileError` condition and a Warning event. The
        next published status (the error gone) drops the condition again."""
        meta = self.job.metadata
        now = timestamp(time.time())
        kept = [c for c in (self.last or {}).get("conditions") or [] if c.get("type") != RECONCILE_ERROR]
        condition = {"type": RECONCILE_ERROR, "status": "True", "reason": reason, "message": message,
                     "lastTransitionTime": now}  # fmt: skip
        body = {"status": {"conditions": [*kept, condition]}}
        self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, meta.namespace, PLURAL, meta.name, body)
        self.emit(JobEvent(WARNING, reason, message))
        self.last = None  # the next publish writes the whole status again, without the condition

    def emit(self, event: JobEvent) -> None:
        meta = self.job.metadata
        now = timestamp(time.time())
        body = {
            "metadata": {"name": f"{meta.name}.{secrets.token_hex(8)}", "namespace": meta.namespace},
            "involvedObject": {
                "apiVersion": self.job.api_version,
                "kind": self.job.kind,
                "name": meta.name,
                "namespace": meta.namespace,
                "uid": meta.uid or "",
            },
            "type": event.type,
            "reason": event.reason,
            "message": event.message,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": COMPONENT},
            "reportingComponent": f"{GROUP}/controller",
            "reportingInstance": self.instance,
        }
        try:
            self.core.create_namespaced_event(meta.namespace, body, _preload_content=False)
        except (ApiException, *TRANSPORT_ERRORS) as err:  # best effort: never stop reconciling for an event
            log.warning("event %s for %s not written: %s", event.reason, self.job.key, err)
