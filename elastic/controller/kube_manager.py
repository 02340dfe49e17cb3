"""`elastic controller --backend kubernetes`: every ElasticJob of the cluster, reconciled by the leader only."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from kubernetes import config
from kubernetes.client import ApiClient, CoordinationV1Api, CoreV1Api, CustomObjectsApi

from elastic.cluster.kubernetes import KubernetesWorkers
from elastic.codec import CorruptValueError, decode_json_object
from elastic.controller.election import Election
from elastic.controller.kube_leadership import FencedWorkers, KubeLeadership, exit_on_loss
from elastic.controller.kube_status import KubeStatus
from elastic.controller.leader import LEASE_NAME, KubernetesLeases, LeaderElector
from elastic.controller.loop import JobController
from elastic.controller.status import FINAL_PHASES
from elastic.errors import NotLeaderError, PermanentError
from elastic.spec import ElasticJob, parse_job
from elastic.spec.crd import GROUP, PLURAL, VERSION
from elastic.store import Delete, JobKeys, ModRevisionIs, Put, Store
from elastic.store.fenced import FencedStore

log = logging.getLogger(__name__)


class KubernetesControllerManager:
    """`elastic controller --backend kubernetes`: ElasticJobs from the API server, run state in etcd.

    Only the leader acts (kube_leadership.py): the Lease is renewed on its own thread, each step asks
    for the fenced store of the etcd epoch, and every etcd write of the step goes through it (a replica
    deposed mid-step gets `NotLeaderError` and writes nothing). The leader copies each ElasticJob's spec
    into etcd (run id = the object's uid, so a re-created job never joins a stale run; `kubectl scale`/`edit`
    reach the JobController through the etcd spec), then steps one JobController per job with
    `KubernetesWorkers` (each pod write checked against the epoch first), and publishes each status with
    `KubeStatus`.
    A new leader adopts the pods it finds (their labels say which worker of which job they are).
    """

    def __init__(
        self,
        store: Store,
        endpoints: str,
        api_client: ApiClient,
        identity: str,
        lease_namespace: str,
        watch_namespace: str | None = None,
        lease_seconds: int = 15,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.endpoints = endpoints
        self.core = CoreV1Api(api_client)
        self.custom = CustomObjectsApi(api_client)
        leases = KubernetesLeases(CoordinationV1Api(api_client), timeout=lease_seconds / 5)
        self.elector = LeaderElector(leases, lease_namespace, identity, lease_seconds)
        self.leadership = KubeLeadership(self.elector, Election(store, role="kubernetes-controller"), on_lost)
        self._acting_as: FencedStore | None = None
        self.watch_namespace = watch_namespace
        self.controllers: dict[str, tuple[JobController, FencedWorkers, KubeStatus]] = {}
        self.finished: set[str] = set()  # `namespace/name/uid` of jobs already wound down

    def _list_jobs(self) -> list[dict[str, Any]]:
        if self.watch_namespace:
            listed = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.watch_namespace, PLURAL)
        else:
            listed = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        return listed.get("items") or []

    def _sync(self, obj: dict[str, Any], store: Store) -> ElasticJob | None:
        """The ElasticJob as the controller runs it, its spec written to etcd when new or changed."""
        meta = obj.get("metadata") or {}
        try:
            job = parse_job(
                {
                    "apiVersion": obj.get("apiVersion"),
                    "kind": obj.get("kind"),
                    "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid")},
                    "spec": obj.get("spec"),
                }
            )
        except Exception as err:  # the CRD schema should have refused it; never stop the others for one
            log.warning("ElasticJob %s/%s skipped: %s", meta.get("namespace"), meta.get("name"), err)
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

    def step(self) -> bool:
        """One pass; False while this replica does not act (another leads, or it was deposed mid-pass)."""
        fenced = self.leadership.lead()
        if fenced is not self._acting_as:  # a new term, or none: controllers of an old term must not act
            self.controllers.clear()  # the leader owns the pods; nothing is stopped here
            self._acting_as = fenced
        if fenced is None:
            return False
        try:
            self._step_jobs(fenced)
        except NotLeaderError as err:
            log.warning("%s", err)
            self.controllers.clear()
            return False
        return True

    def _step_jobs(self, store: FencedStore) -> None:
        check = partial(self.leadership.check, store)  # before each pod or status write to the API server
        jobs = {}
        for obj in self._list_jobs():
            meta = obj.get("metadata") or {}
            key = f"{meta.get('namespace')}/{meta.get('name')}"
            if key not in self.controllers and (obj.get("status") or {}).get("phase") in FINAL_PHASES:
                continue  # finished before: never run again, even after its keys in etcd expired
            job = self._sync(obj, store)
            if job is not None:
                jobs[job.key] = (job, obj)
        for key in list(self.controllers):
            if key not in jobs or self.controllers[key][0].job.metadata.uid != jobs[key][0].metadata.uid:
                del self.controllers[key]  # deleted: its pods go with it (owner reference)
        for key, (job, obj) in jobs.items():
            done_key = f"{key}/{job.metadata.uid}"
            if key not in self.controllers and done_key not in self.finished:
                workers = FencedWorkers(KubernetesWorkers(self.core, job), check)
                previous = obj.get("status") or None
                status = KubeStatus(self.custom, self.core, job, previous, instance=self.elector.identity)
                self.controllers[key] = (JobController(store, job, workers, self.endpoints), workers, status)
        for key, (controller, workers, kube_status) in list(self.controllers.items()):
            job_status = controller.step()
            check(f"publishing the status of {key}")
            kube_status.publish(job_status)
            if controller.done():
                controller.finish()
                workers.finish()
                self.finished.add(f"{key}/{controller.job.metadata.uid}")
                del self.controllers[key]

    def start(self) -> KubernetesControllerManager:
        """Start renewing (or trying to take) the Lease on its own thread."""
        self.leadership.start()
        return self

    def close(self) -> None:
        """Stop renewing, give the etcd epoch and the Lease up: another replica takes over at once."""
        self.leadership.close()

    def __enter__(self) -> KubernetesControllerManager:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run_forever(self, period: float = 1.0) -> None:
        with self:
            while True:
                self.step()
                time.sleep(period)


def run_kubernetes_controller(store: Store, endpoints: str) -> int:
    """In a pod: in-cluster config, identity POD_NAME, Lease in POD_NAMESPACE; elsewhere: the kubeconfig."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as err:
            raise PermanentError(f"no Kubernetes API (not in a pod, and no usable kubeconfig): {err}") from err
    identity = f"{os.environ.get('POD_NAME') or socket.gethostname()}_{os.getpid()}"
    namespace = os.environ.get("POD_NAMESPACE", "elastic-system")
    manager = KubernetesControllerManager(store, endpoints, ApiClient(), identity, namespace, on_lost=exit_on_loss)
    print(f"controller {identity} watching ElasticJobs (lease {namespace}/{LEASE_NAME})", flush=True)
    manager.run_forever()
    return 0


def _stored_spec(key: str, value: bytes) -> dict[str, Any]:
    """The spec etcd holds for a job; on Kubernetes the ElasticJob object is the truth, so one that does not
    decode is simply replaced (read as empty)."""
    try:
        return decode_json_object(key, value)
    except CorruptValueError:
        return {}
