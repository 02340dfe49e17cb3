"""Workers as Kubernetes pods: one pod per worker, owned by its ElasticJob, observed by listing its pods.

This module is the I/O: the WorkerSet that creates, lists, patches and deletes pods. What a pod looks like
is `pod_manifest.py`'s, and what a listed pod means (a WorkerObservation) is `pod_status.py`'s: both pure,
tested without an API server.

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

Every request has a deadline (`BoundedApiClient`): an API server that accepts a request and never answers
(a half-open connection, a restarting server behind a load balancer) costs the request its timeout, never
the controller its loop. Such transport failures are `TRANSPORT_ERRORS`, retried like a 5xx.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes.client import ApiClient, ApiException, Configuration, CoreV1Api

from elastic.cluster.base import WorkerLaunch, WorkerObservation
from elastic.cluster.pod_manifest import (
    INCARNATION_LABEL,
    TRACKING_FINALIZER,
    WORKER_LABEL,
    grace_seconds,
    job_selector,
    owned_by,
    pod_manifest,
    refused_pod,
)
from elastic.cluster.pod_status import NODE_LOST, TERMINAL_PHASES, exit_reason, observe_pod, parse_time
from elastic.spec import ElasticJob

log = logging.getLogger(__name__)

EXPECTATION_SECONDS = 30.0  # how long a created pod may be missing from the informer's cache
REQUEST_TIMEOUT = (5.0, 30.0)  # (connect, read) seconds of every request that does not say otherwise
# What a request raises when the API server is not reached or stops answering: refused, reset, timed out
# (urllib3's MaxRetryError, ProtocolError, ReadTimeoutError; socket errors). Temporary, like a 503.
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (urllib3.exceptions.HTTPError, OSError)


class BoundedApiClient(ApiClient):
    """The controller's `ApiClient`: every request without a `_request_timeout` of its own gets `timeout`, and
    urllib3 retries nothing.

    The generated API methods pass no timeout unless asked, and a request left without one waits forever on
    a connection that stopped answering (kubernetes-client/python#1148, #1402). urllib3's default of three
    retries would make every timed-out GET take four times its timeout: the work queue and the Lease's renew
    loop retry instead, each with its own delay.
    """

    def __init__(self, configuration: Configuration, timeout: tuple[float, float] = REQUEST_TIMEOUT) -> None:
        configuration = copy.deepcopy(configuration)
        configuration.retries = False
        super().__init__(configuration)
        self.timeout = timeout

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        """Every generated method passes `_request_timeout` by keyword (None unless asked), in each client
        version pyproject.toml admits; the positional parameters differ between them (29: the path first)."""
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = self.timeout
        return super().call_api(*args, **kwargs)


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
        self._known.setdefault(self._name_of(pod), parse_time(pod["metadata"].get("creationTimestamp")))
        with contextlib.suppress(ValueError):
            self._incarnation = max(self._incarnation, int(labels.get(INCARNATION_LABEL, 0)))

    def start(self, launch: WorkerLaunch) -> None:
        """Create the worker's pod. A name already taken (409) is never adopted: a worker's suffix has 16
        bits, so the pod holding the name may well be another live worker of the same job, and taking it for
        this one would count one pod as two workers. A create whose answer was lost is not retried here
        (the client retries nothing): its pod is found by the informer and observed like any other."""
        self._incarnation += 1
        body = pod_manifest(self.job, self.namespace, launch, self._incarnation, self.etcd_secret)
        try:
            self.api.create_namespaced_pod(self.namespace, body, _preload_content=False)
        except ApiException as err:
            refused = refused_pod(err, launch.name)
            if refused is not None:
                raise refused from None
            raise  # a 409 too: another pod holds the name, and the job retries with a fresh one (see `start`)
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
        return read_pod(self.api, self.namespace, name)

    def _release(self, pod: dict[str, Any]) -> None:
        release_pod(self.api, pod)

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


def read_pod(api: CoreV1Api, namespace: str, name: str) -> dict[str, Any] | None:
    """The pod as the API server has it now, or None (404)."""
    try:
        response = api.read_namespaced_pod(name, namespace, _preload_content=False)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return json.loads(response.data)


def release_pod(api: CoreV1Api, pod: dict[str, Any], fresh: bool = True) -> None:
    """Take the tracking finalizer off (only ours: others' finalizers stay), if the pod has it."""
    meta, tracking = pod["metadata"], TRACKING_FINALIZER
    finalizers = meta.get("finalizers") or []
    if tracking not in finalizers:
        return
    # A JSON patch (a list body is one for every client version): a strategic merge patch would *add* to
    # finalizers (their patch strategy is merge); the test makes it apply to the pod as read only.
    patch = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
        {"op": "replace", "path": "/metadata/finalizers", "value": [f for f in finalizers if f != tracking]},
    ]
    try:
        api.patch_namespaced_pod(meta["name"], meta["namespace"], patch, _preload_content=False)
    except ApiException as err:
        if err.status == 404:
            return
        if err.status not in (409, 422) or not fresh:
            raise
        current = read_pod(api, meta["namespace"], meta["name"])  # changed since it was read (a cache lags)
        if current is not None:
            release_pod(api, current, fresh=False)
