"""`elastic controller --backend kubernetes`: every ElasticJob of the cluster, reconciled by the leader only."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Hashable
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import config
from kubernetes.client import (
    ApiException,
    Configuration,
    CoordinationV1Api,
    CoreV1Api,
    CustomObjectsApi,
    PolicyV1Api,
)

from elastic.cluster.kubernetes import TRANSPORT_ERRORS, BoundedApiClient, KubernetesWorkers, release_pod
from elastic.cluster.pod_manifest import TRACKING_FINALIZER, disruption_budget, owned_by
from elastic.codec import CorruptValueError, decode_json_object
from elastic.controller.kube_status import KubeStatus
from elastic.controller.loop import JobController
from elastic.controller.machinery.etcd_election import Election
from elastic.controller.machinery.informer import WATCH_READ_SECONDS, Informer, object_key
from elastic.controller.machinery.job_events import JobEvents, queue_when_due
from elastic.controller.machinery.kube_leadership import FencedWorkers, KubeLeadership, exit_on_loss
from elastic.controller.machinery.lease_election import LEASE_NAME, KubernetesLeases, LeaderElector
from elastic.controller.machinery.workqueue import WorkQueue
from elastic.controller.metrics_export import ControllerMetrics
from elastic.controller.status import FINAL_PHASES
from elastic.errors import ElasticError, NotLeaderError, PermanentError
from elastic.policy.bounds import clamp_replicas
from elastic.spec import ElasticJob, parse_job
from elastic.spec.crd import GROUP, PLURAL, VERSION
from elastic.store import Delete, JobKeys, ModRevisionIs, Put, Store
from elastic.store.fenced import FencedStore
from elastic.store.keys import controller_leader_key
from elastic.store.outage import Outage

log = logging.getLogger(__name__)


JOB_FINALIZER = "elastic.dev/cleanup"  # on each ElasticJob: its etcd keys go before the object does
RESYNC_SECONDS = 300.0  # every cached job once more, for an event that might have been lost
# /healthz fails once the last pass, or the last word from the API server on a watch, is older than this:
# above the watches' read timeout (a dead watch is noticed and retried before the kubelet is told).
STALE_SECONDS = 2 * WATCH_READ_SECONDS
_WORKER_PODS = "elastic.dev/job"  # label selector: every pod of every ElasticJob


class KubernetesControllerManager:
    """`elastic controller --backend kubernetes`: ElasticJobs from the API server, run state in etcd.

    Reads come from two informers (machinery/informer.py): the ElasticJobs and every worker pod, each listed once and
    then followed by a watch, so a pass makes no list request at all; a change enqueues its job in a work
    queue (machinery/workqueue.py); a watch of the jobs' keys in etcd queues a job when its round, members or budget
    change (machinery/job_events.py), and a job is queued for a time only when a deadline or timeout of its own
    falls due then (`reconcile.seconds_until_due`): nothing polls. One job's handling never stops
    another's: an API error for a job (409, 429, 5xx, an RBAC 403) becomes a `ReconcileError` condition and
    a Warning event on that job, and the job is retried after a growing delay; a pod the API server refuses
    for good (Pod Security, an invalid template) fails that job (WorkerStartFailed). Every request has a
    deadline (`BoundedApiClient`, the watches' read timeout): a timed-out, refused or reset request is that
    job's retry with backoff, and the rest of the pass waits for the next one (the server is likely away for
    every job alike); nothing of the API server's state ends the process. Once an informer lists again
    after a failure, every job is queued: what changed while the server was away is seen at once.

    Only the leader acts (machinery/kube_leadership.py): each pass asks for the fenced store of the etcd epoch and
    every etcd write goes through it. The ElasticJob object is the only truth for the spec: it is mirrored
    into etcd for the agents (their failure rules), and never read back from there. Each job carries the
    `elastic.dev/cleanup` finalizer: `kubectl delete` stops its workers, removes its etcd keys, then lets the
    object go; a job being deleted is not reconciled any more.
    """

    def __init__(
        self,
        store: Store,
        endpoints: str,
        api_client: BoundedApiClient,
        identity: str,
        lease_namespace: str,
        watch_namespace: str | None = None,
        lease_seconds: int = 15,
        on_lost: Callable[[str], None] | None = None,
        worker_etcd_secret: str | None = None,
        metrics: ControllerMetrics | None = None,
        watch_read_seconds: float = WATCH_READ_SECONDS,
        stale_seconds: float = STALE_SECONDS,
    ) -> None:
        """`api_client`: a `BoundedApiClient` (a plain one would let a hung request stop the controller).
        `watch_read_seconds`: a watch silent that long is a dead connection; `stale_seconds`: see `unhealthy`."""
        if not isinstance(api_client, BoundedApiClient):
            raise TypeError("the controller needs a BoundedApiClient: every request must have a deadline")
        self.store = store
        self.metrics = metrics  # one per process: counts survive a change of leader
        self.worker_etcd_secret = worker_etcd_secret
        self.outage = Outage("the controller")  # etcd away: two lines per outage (step_through_outages)
        self.endpoints = endpoints
        self.core = CoreV1Api(api_client)
        self.custom = CustomObjectsApi(api_client)
        self.policy = PolicyV1Api(api_client)
        leases = KubernetesLeases(CoordinationV1Api(api_client), timeout=lease_seconds / 5)
        self.elector = LeaderElector(leases, lease_namespace, identity, lease_seconds)
        election = Election(store, role="kubernetes-controller", key=controller_leader_key("kubernetes"))
        self.leadership = KubeLeadership(self.elector, election, on_lost)
        self._acting_as: FencedStore | None = None
        self.watch_namespace = watch_namespace
        self.watch_read_seconds = watch_read_seconds
        self.stale_seconds = stale_seconds
        self.queue = WorkQueue()
        self._seen: dict[tuple[str, str], tuple[Any, ...]] = {}  # what of each job last queued it
        self.jobs = self._job_informer()
        self.pods = self._pod_informer()
        self.controllers: dict[str, tuple[JobController, FencedWorkers, KubeStatus]] = {}
        self.finished: set[str] = set()  # `namespace/name/uid` of jobs already wound down
        self._budgets: dict[str, tuple[str | None, int]] = {}  # job -> (uid, minAvailable) of the PDB written
        self._resynced = time.monotonic()
        self._passed = time.monotonic()  # when the last pass ended (/healthz)
        self._relists = 0  # both informers' relists, as of the last pass
        self._sweep_due = False  # release orphaned tracking finalizers once the caches are in
        # The informers see the API server only; a job's round, members, budget or end change in etcd.
        self._events = JobEvents(store, self.queue, on_lost=self._requeue_known)

    def _job_informer(self) -> Informer:
        enqueue = self._enqueue_job
        if self.watch_namespace:
            return Informer(self.custom.list_namespaced_custom_object, enqueue, GROUP, VERSION, self.watch_namespace,
                            PLURAL, read_seconds=self.watch_read_seconds)  # fmt: skip
        return Informer(self.custom.list_cluster_custom_object, enqueue, GROUP, VERSION, PLURAL,
                        read_seconds=self.watch_read_seconds)  # fmt: skip

    def _pod_informer(self) -> Informer:
        enqueue, by_job = self._enqueue_pods_job, _job_of_pod
        if self.watch_namespace:
            return Informer(self.core.list_namespaced_pod, enqueue, self.watch_namespace, label_selector=_WORKER_PODS,
                            index=by_job, read_seconds=self.watch_read_seconds)  # fmt: skip
        return Informer(self.core.list_pod_for_all_namespaces, enqueue, label_selector=_WORKER_PODS, index=by_job,
                        read_seconds=self.watch_read_seconds)  # fmt: skip

    def _enqueue_job(self, obj: dict[str, Any]) -> None:
        """A job changed: queue it, unless only its status did (controller-runtime's generation predicate).
        The status is this controller's own write; reacting to it would bypass a failing job's backoff."""
        key = object_key(obj)
        meta = obj.get("metadata") or {}
        seen = (meta.get("uid"), meta.get("generation"), bool(meta.get("deletionTimestamp")),
                tuple(meta.get("finalizers") or ()), self.jobs.get(*key) is None)  # fmt: skip
        if self._seen.get(key) != seen:
            self._seen[key] = seen
            self.queue.add(key)

    def _enqueue_pods_job(self, pod: dict[str, Any]) -> None:
        namespace, job = _job_of_pod(pod)
        if job:
            self.queue.add((namespace, job))

    # --- lifecycle ---

    def ready(self) -> bool:
        """Both caches hold their first list: this replica can act as soon as it leads (/readyz)."""
        return self.jobs.wait_synced(0) and self.pods.wait_synced(0)

    def unhealthy(self) -> str | None:
        """Why the kubelet should restart this replica (/healthz), or None: its loop has not finished a pass,
        or an informer has not heard from the API server, for `stale_seconds`. A request or a watch that
        hangs is bounded already; this catches whatever else freezes the loop or the caches."""
        now = time.monotonic()
        if now - self._passed > self.stale_seconds:
            return f"no reconcile pass for {now - self._passed:.0f} s"
        for informer in (self.jobs, self.pods):
            if now - informer.heard > self.stale_seconds:
                name = informer.list_function.__name__
                return f"no answer to {name} (list or watch) for {now - informer.heard:.0f} s"
        return None

    def start(self) -> KubernetesControllerManager:
        """Start renewing (or trying to take) the Lease, the informers and the etcd watch, each on a thread."""
        self.leadership.start()
        self.jobs.start()
        self.pods.start()
        self._events.start()
        return self

    def close(self) -> None:
        """Stop renewing, give the etcd epoch and the Lease up: another replica takes over at once."""
        self._events.close()
        self.jobs.stop()
        self.pods.stop()
        self.leadership.close()

    def _requeue_known(self) -> None:
        """The etcd watch failed: queue every job this replica drives (whatever was missed meanwhile)."""
        for key in list(self.controllers):
            self.queue.add(tuple(key.split("/", 1)))

    def __enter__(self) -> KubernetesControllerManager:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run_forever(self, wait: float = 1.0) -> None:
        with self:
            while True:
                self.step_through_outages(wait)

    def step_through_outages(self, wait: float = 0.0) -> bool:
        """One pass, as `run_forever` takes them: etcd away is a wait, said once (`self.outage`), never an exit
        (the API server's own outages are the informers' and the bounded requests' to ride out); the pass is
        taken again once etcd answers."""
        return self.outage.call(lambda: self.step(wait))

    # --- passes ---

    def step(self, wait: float = 0.0) -> bool:
        """One pass: every job queued now (waiting up to `wait` for one); False while this replica does not
        act (another leads, or it was deposed mid-pass)."""
        try:
            return self._pass(wait)
        finally:
            self._passed = time.monotonic()

    def _pass(self, wait: float) -> bool:
        fenced = self.leadership.lead()
        if fenced is not self._acting_as:  # a new term, or none: controllers of an old term must not act
            self.controllers.clear()  # the leader owns the pods; nothing is stopped here
            self._acting_as = fenced
            if fenced is not None:
                self._resync()
        if fenced is None:
            time.sleep(min(wait, 0.2))
            return False
        if not (self.jobs.wait_synced(10) and self.pods.wait_synced(10)):
            return False  # an empty cache is not "no jobs": act once the first lists are in
        relists = self.jobs.relists + self.pods.relists
        if time.monotonic() - self._resynced > RESYNC_SECONDS or relists != self._relists:
            self._relists = relists  # a relist: the API server is back, or events were lost (410)
            self._resync()
        try:
            if self._sweep_due:
                self._sweep_due = False
                self._sweep(fenced)
            key = self.queue.get(wait)
            while key is not None and self._handle(key, fenced):
                key = self.queue.get(0)
        except NotLeaderError as err:
            log.warning("%s", err)
            self.controllers.clear()
            return False
        return True

    def _resync(self) -> None:
        self._resynced = time.monotonic()
        self._sweep_due = True
        for obj in self.jobs.items():  # every cached job, changed or not: the safety net for a lost event
            self.queue.add(object_key(obj))
        for key in list(self.controllers):  # jobs deleted while nobody watched
            namespace, name = key.split("/", 1)
            self.queue.add((namespace, name))

    def _sweep(self, store: FencedStore) -> None:
        """Release the tracking finalizer of every pod no job of this term will handle: its job is gone (or
        re-created under a new uid), or finished without this replica winding it down (its controller died
        between the final status and releasing its pods, or another replica ran it). Without this, such
        pods stay Terminating for good. At the start of each term and at every resync; a failure waits for
        the next one."""
        for pod in self.pods.items():
            meta = pod.get("metadata") or {}
            if TRACKING_FINALIZER not in (meta.get("finalizers") or []):
                continue
            namespace, name = _job_of_pod(pod)
            job = self.jobs.get(namespace, name)
            job_meta = (job or {}).get("metadata") or {}
            if job is not None and owned_by(pod, job_meta.get("uid")) and (
                f"{namespace}/{name}" in self.controllers
                or (job.get("status") or {}).get("phase") not in FINAL_PHASES
            ):
                continue  # a live job's pod: its own reconcile releases it once its end is handled
            try:
                self.leadership.check(store, f"releasing orphaned pod {namespace}/{meta.get('name')}")
                release_pod(self.core, pod)
                log.info("pod %s/%s: tracking finalizer released (job %s gone or finished)", namespace,
                         meta.get("name"), name)  # fmt: skip
            except (ApiException, *TRANSPORT_ERRORS) as err:
                log.warning("pod %s/%s: orphaned tracking finalizer not released: %s", namespace, meta.get("name"),
                            err)  # fmt: skip
                return

    def _handle(self, key: Hashable, store: FencedStore) -> bool:
        """Reconcile one job; False when the API server was not reached (the pass ends there: each other
        job would wait out its own timeout against the same server)."""
        try:
            self._reconcile(key, store)  # type: ignore[arg-type]
            self.queue.forget(key)
        except NotLeaderError:
            raise
        except ApiException as err:  # this job's trouble, not the controller's: say so on the job, retry it
            delay = self.queue.retry(key)
            self._report(key, err, delay)  # type: ignore[arg-type]
        except ElasticError as err:
            delay = self.queue.retry(key)
            log.warning("job %s/%s: %s; retrying in %.1f s", *key, err, delay)  # type: ignore[misc]
        except TRANSPORT_ERRORS as err:  # no answer at all: nothing can be written on the job either
            delay = self.queue.retry(key)
            log.warning("job %s/%s: API server not reached (%s); retrying in %.1f s", *key, err, delay)  # type: ignore[misc]
            return False
        finally:
            self.queue.done(key)
        return True

    def _reconcile(self, key: tuple[str, str], store: FencedStore) -> None:
        namespace, name = key
        job_key = f"{namespace}/{name}"
        obj = self.jobs.get(namespace, name)
        if obj is None:  # gone from the API: its pods go with it (owner reference); none keeps our finalizer
            self._budgets.pop(job_key, None)
            entry = self.controllers.pop(job_key, None)
            if entry is not None:
                entry[1].workers.release_all()
            return
        meta = obj.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            self._clean_up(job_key, obj, store)
            return
        if job_key in self.controllers and self.controllers[job_key][0].job.metadata.uid != meta.get("uid"):
            del self.controllers[job_key]  # deleted and re-created under the same name
        if job_key not in self.controllers and (obj.get("status") or {}).get("phase") in FINAL_PHASES:
            return  # finished before: never run again, even after its keys in etcd expired
        if f"{job_key}/{meta.get('uid')}" in self.finished:
            return
        job = self._sync(obj, store)
        if job is None:
            return
        check = partial(self.leadership.check, store)  # before each pod or status write to the API server
        settled = _settled(obj, job)
        if settled:
            check(f"adding the cleanup finalizer and spec.replicas of {job_key}")
            self._patch(obj, settled)
        if job_key not in self.controllers:
            cached = partial(self.pods.indexed, (namespace, name))  # this job's pods only, from the cache
            pods = KubernetesWorkers(self.core, job, pods=cached, etcd_secret=self.worker_etcd_secret)
            workers = FencedWorkers(pods, check)
            status = KubeStatus(self.custom, self.core, job, obj.get("status") or None, instance=self.elector.identity)
            controller = JobController(store, job, workers, self.endpoints, spec_from_store=False, metrics=self.metrics)
            self.controllers[job_key] = (controller, workers, status)
        controller, workers, kube_status = self.controllers[job_key]
        controller.job = job  # the object's spec, this pass (kubectl scale/edit)
        self._keep_budget(job_key, job, check)
        job_status = controller.step()
        check(f"publishing the status of {job_key}")
        kube_status.publish(job_status, meta.get("generation"))
        if controller.done():
            controller.finish()
            workers.finish()
            self.finished.add(f"{job_key}/{job.metadata.uid}")
            del self.controllers[job_key]
        else:
            queue_when_due(self.queue, key, controller.due_in)  # nothing but events and due times queue a job

    def _keep_budget(self, job_key: str, job: ElasticJob, check: Callable[[str], None]) -> None:
        """spec.podDisruptionBudget: the job's PDB created, or its minAvailable brought to minReplicas, when
        that differs from what this replica last wrote (no request otherwise); deleted when the flag goes
        off. The job owns it: deleting the job deletes it (garbage collection)."""
        wanted = (job.metadata.uid, job.spec.min_replicas) if job.spec.pod_disruption_budget else None
        if self._budgets.get(job_key) == wanted:
            return
        namespace, name = job.metadata.namespace, job.metadata.name
        check(f"writing the PodDisruptionBudget of {job_key}")
        if wanted is None:
            try:
                self.policy.delete_namespaced_pod_disruption_budget(name, namespace, _preload_content=False)
            except ApiException as err:
                if err.status != 404:
                    raise
            del self._budgets[job_key]
            return
        body = disruption_budget(job)
        try:
            self.policy.create_namespaced_pod_disruption_budget(namespace, body, _preload_content=False)
        except ApiException as err:
            if err.status != 409:
                raise  # 409: it exists (this replica restarted, or minReplicas changed): bring it up to date
            spec = {"spec": {"minAvailable": job.spec.min_replicas}}
            self.policy.patch_namespaced_pod_disruption_budget(name, namespace, spec, _preload_content=False)
        self._budgets[job_key] = wanted

    def _sync(self, obj: dict[str, Any], store: Store) -> ElasticJob | None:
        """The ElasticJob as the controller runs it, its spec mirrored into etcd (for the agents' failure
        rules) when new or changed. Never read back: etcd is not where a pod's command comes from."""
        job = _job_of(obj)
        if job is None:
            return None
        keys = JobKeys(job.metadata.namespace, job.metadata.name)
        existing = store.get(keys.spec)
        wanted = job.to_dict()
        if existing is None:
            store.txn([ModRevisionIs(keys.spec, 0)], [Put.json(keys.spec, wanted)])
        elif (stored := _stored_spec(keys.spec, existing.value)) != wanted:
            if (stored.get("metadata") or {}).get("uid") != job.metadata.uid:  # deleted and re-created
                store.txn([ModRevisionIs(keys.spec, existing.mod_revision)], [Delete(keys.prefix, prefix=True)])
            store.put_json(keys.spec, wanted)
        return job

    def _clean_up(self, job_key: str, obj: dict[str, Any], store: FencedStore) -> None:
        """`kubectl delete`: stop the workers, remove the job's etcd keys, then let the object go."""
        meta = obj["metadata"]
        if JOB_FINALIZER not in (meta.get("finalizers") or []):
            return  # done already: the API server removes the object
        entry = self.controllers.pop(job_key, None)
        # From the object, never `_sync`: a retry of a clean-up whose last write went through unanswered
        # would put the spec back into etcd, and nothing would remove it once the object is gone.
        job = entry[0].job if entry else _job_of(obj)
        if job is not None:
            self.leadership.check(store, f"stopping the pods of {job_key}")
            KubernetesWorkers(self.core, job).finish()
            store.delete_prefix(JobKeys(job.metadata.namespace, job.metadata.name).prefix)
        self.leadership.check(store, f"removing the cleanup finalizer of {job_key}")
        self._patch(obj, {"metadata": {"finalizers": [f for f in meta["finalizers"] if f != JOB_FINALIZER] or None}})

    def _patch(self, obj: dict[str, Any], patch: dict[str, Any]) -> None:
        """A merge patch (a custom resource's list is replaced whole) carrying the resourceVersion read: a
        finalizer list or a field is never written over a newer object (409, and the job is retried from a
        fresh cache)."""
        meta = obj["metadata"]
        body = {**patch, "metadata": {**(patch.get("metadata") or {}), "resourceVersion": meta["resourceVersion"]}}
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], body)

    def _report(self, key: tuple[str, str], err: ApiException, delay: float) -> None:
        """An API error of one job, on that job: a ReconcileError condition and a Warning event."""
        namespace, name = key
        reason = _REASONS.get(err.status, "ApiError")
        message = f"{err.status} {err.reason}: {_api_message(err)}; retrying in {delay:.0f} s"
        log.warning("job %s/%s: %s", namespace, name, message)
        obj = self.jobs.get(namespace, name)
        if obj is None:
            return
        entry = self.controllers.get(f"{namespace}/{name}")
        if entry is not None:
            status = entry[2]
        else:
            job = _job_of(obj)
            if job is None:
                return
            status = KubeStatus(self.custom, self.core, job, obj.get("status") or None, self.elector.identity)
        try:
            status.report_error(reason, message)
        except (ApiException, *TRANSPORT_ERRORS) as again:  # refused even that: the log line is all there is
            log.warning("job %s/%s: could not report %s: %s", namespace, name, reason, again)

def _job_of(obj: dict[str, Any]) -> ElasticJob | None:
    """The ElasticJob an API object describes (its spec, name, namespace and uid), or None, logged: the CRD
    schema should have refused a spec that does not parse, and one such object never stops the others."""
    meta = obj.get("metadata") or {}
    try:
        return parse_job(
            {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid")},
                "spec": obj.get("spec"),
            }
        )
    except Exception as err:
        log.warning("ElasticJob %s/%s skipped: %s", meta.get("namespace"), meta.get("name"), err)
        return None


def _settled(obj: dict[str, Any], job: ElasticJob) -> dict[str, Any]:
    """What a job's object lacks, as a merge patch (empty: nothing): the cleanup finalizer, and
    `spec.replicas` when unset. Unset means maxReplicas, but apiextensions answers GET /scale of an object
    without the field with a 500, so an HPA (or `kubectl scale --current-replicas`) could not read the job;
    no CRD default can say "maxReplicas", so the controller writes that value, once."""
    meta, patch = obj.get("metadata") or {}, {}
    if JOB_FINALIZER not in (meta.get("finalizers") or []):
        patch["metadata"] = {"finalizers": [*(meta.get("finalizers") or []), JOB_FINALIZER]}
    if (obj.get("spec") or {}).get("replicas") is None:
        patch["spec"] = {"replicas": clamp_replicas(job.spec.replicas, job.spec.min_replicas, job.spec.max_replicas)}
    return patch


def _job_of_pod(pod: dict[str, Any]) -> tuple[str, str]:
    """(namespace, job name) of a worker pod, from its `elastic.dev/job` label."""
    meta = pod.get("metadata") or {}
    return meta.get("namespace") or "", (meta.get("labels") or {}).get(_WORKER_PODS) or ""


_REASONS = {403: "Forbidden", 409: "Conflict", 422: "Invalid", 429: "TooManyRequests"}


def _api_message(err: ApiException) -> str:
    try:
        return str(json.loads(err.body).get("message") or err.reason)[:300]
    except (TypeError, ValueError, AttributeError):
        return str(err.reason)


def run_kubernetes_controller(
    store: Store, endpoints: str, health_port: int | None = None, metrics: ControllerMetrics | None = None
) -> int:
    """In a pod: in-cluster config, identity POD_NAME, Lease in POD_NAMESPACE, ElasticJobs of
    WATCH_NAMESPACE only when set (the namespaced install), worker pods' etcd credentials from the Secret
    ELASTIC_WORKER_ETCD_SECRET names (in each job's namespace); elsewhere: the kubeconfig."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as err:
            raise PermanentError(f"no Kubernetes API (not in a pod, and no usable kubeconfig): {err}") from err
    identity = f"{os.environ.get('POD_NAME') or socket.gethostname()}_{os.getpid()}"
    namespace = os.environ.get("POD_NAMESPACE", "elastic-system")
    watched = os.environ.get("WATCH_NAMESPACE") or None
    api_client = BoundedApiClient(Configuration.get_default_copy())  # the configuration just loaded
    manager = KubernetesControllerManager(
        store, endpoints, api_client, identity, namespace, watch_namespace=watched, on_lost=exit_on_loss,
        worker_etcd_secret=os.environ.get("ELASTIC_WORKER_ETCD_SECRET") or None, metrics=metrics,
    )
    if health_port is not None:
        serve_health(health_port, manager.ready, manager.unhealthy)
    scope = f"namespace {watched}" if watched else "every namespace"
    print(f"controller {identity} watching ElasticJobs in {scope} (lease {namespace}/{LEASE_NAME})", flush=True)
    manager.run_forever()
    return 0


def serve_health(port: int, ready: Callable[[], bool], unhealthy: Callable[[], str | None]) -> ThreadingHTTPServer:
    """`/healthz` (the loop passes and the API server is heard: else the kubelet restarts the replica) and
    `/readyz` (its caches are synced: it can lead at once), as controller-runtime serves them for the
    kubelet's probes; on its own thread. A failing probe's body says why."""

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/healthz":
                problem = unhealthy()
            elif self.path == "/readyz":
                problem = None if ready() else "informers not synced"
            else:
                problem = "not found"
            self.send_response(200 if problem is None else 404 if problem == "not found" else 503)
            self.end_headers()
            self.wfile.write(f"{problem or 'ok'}\n".encode())

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("", port), Health)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server


def _stored_spec(key: str, value: bytes) -> dict[str, Any]:
    """The spec etcd holds for a job; on Kubernetes the ElasticJob object is the truth, so one that does not
    decode is simply replaced (read as empty)."""
    try:
        return decode_json_object(key, value)
    except CorruptValueError:
        return {}
