"""Two controller replicas (`elastic controller --backend kubernetes`): one acts, fenced in etcd.

Against a FAKE API server (tests/kubernetes/fake_api.py; no kube-apiserver can run here) through the real
`kubernetes` client, and a real etcd. The test plays the kubelet (pod phases set in the fake's store). A
replica is "killed" or "frozen" by stopping its renew thread and revoking its etcd lease, which is what
etcd does to a dead process's lease after its TTL. A real-cluster test would add two controller pods of the
Deployment, a real pod kill or SIGSTOP, and the API server's own Lease semantics and RBAC enforcement.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_api import FakeApiServer, rbac_allows
from kubernetes import client

from elastic.controller.kube_manager import KubernetesControllerManager
from elastic.controller.machinery.kube_leadership import EXIT_LOST_LEADERSHIP
from elastic.controller.machinery.lease_election import LEASE_NAME, KubernetesLeases, lease_body, parse_lease
from elastic.spec import parse_job
from elastic.store import JobKeys, Store
from elastic.store.keys import controller_leader_key
from elastic.store.server import EtcdServer
from harness.agents import seconds_until, wait_until

LEASE = 2
REPO = Path(__file__).resolve().parents[2]


def add_job(fake: FakeApiServer) -> tuple[str, dict[str, Any]]:
    name = f"lj-{uuid.uuid4().hex[:6]}"
    stored = fake.add_job(
        {
            "apiVersion": "elastic.dev/v1alpha1",
            "kind": "ElasticJob",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"minReplicas": 2, "maxReplicas": 2, "worker": {"command": ["python", "t.py"], "image": "i:1"}},
        }
    )
    return name, stored


@pytest.fixture
def replicas(api_client: client.ApiClient, etcd_server: EtcdServer) -> Iterator[tuple[Store, list]]:
    """A store, and a way to make controller replicas on it; all are closed (epoch and Lease given up) after."""
    made: list[KubernetesControllerManager] = []
    with Store(etcd_server.client_url, retry_seconds=5) as store:

        def replica(identity: str, **kw: Any) -> KubernetesControllerManager:
            manager = KubernetesControllerManager(
                store, etcd_server.client_url, api_client, identity, "elastic-system", lease_seconds=LEASE, **kw
            )
            made.append(manager)
            return manager.start()

        yield store, replica  # type: ignore[misc]
        for manager in made:
            manager.close()
        store.delete(controller_leader_key("kubernetes"))


def freeze(manager: KubernetesControllerManager, store: Store) -> None:
    """The replica's process stops (killed, or SIGSTOPped): no more renewals, and etcd expires its lease."""
    manager.elector.stop()
    record = manager.leadership.election.read()
    assert record is not None and record.holder == manager.leadership.election.holder
    store.revoke(record.lease)


def etcd_state(store: Store, name: str) -> dict[str, tuple[bytes, int]]:
    entries, _ = store.get_prefix(JobKeys("team-a", name).prefix)
    leader = store.get(controller_leader_key("kubernetes"))
    return {e.key: (e.value, e.mod_revision) for e in [*entries, *([leader] if leader else [])]}


def test_only_the_leader_reconciles_and_the_other_takes_over(fake: FakeApiServer, replicas: tuple) -> None:
    store, replica = replicas
    name, stored = add_job(fake)
    a = replica("controller-a")
    assert wait_until(a.step, timeout=5)
    b = replica("controller-b")
    for _ in range(3):
        assert a.step() is True
        assert b.step() is False
    pods = sorted(fake.pods_of(name, "team-a"))
    assert len(pods) == 2 and b.controllers == {}  # two workers, not four: b reconciled nothing
    # the spec went to etcd with the object's uid as the run id
    spec = store.get_json(JobKeys("team-a", name).spec)
    assert parse_job(spec).metadata.uid == stored["metadata"]["uid"]
    assert fake.jobs[("team-a", name)]["status"]["phase"] == "Created"

    freeze(a, store)  # controller-a is killed: controller-b leads once it saw no renewal for a lease
    waited = seconds_until(b.step, timeout=LEASE + 2)
    assert waited <= LEASE + 1.0
    b.step()
    assert sorted(fake.pods_of(name, "team-a")) == pods  # adopted, not duplicated
    fake.set_pod(pods[1], "Failed", 1, namespace="team-a")
    assert wait_until(lambda: b.step() and pods[1] not in fake.pods_of(name, "team-a"), timeout=5)
    now = sorted(fake.pods_of(name, "team-a"))
    assert pods[0] in now and len(now) == 2  # the new leader replaced it
    assert a.step() is False and a.controllers == {}  # the old leader, back, follows
    rbac = list(yaml.safe_load_all((REPO / "manifests" / "rbac.yaml").read_text()))
    assert set(fake.requests) <= rbac_allows(rbac)


def test_a_leader_deposed_while_its_step_stalled_writes_nothing(fake: FakeApiServer, replicas: tuple) -> None:
    store, replica = replicas
    name, _ = add_job(fake)
    a = replica("controller-a")
    assert wait_until(a.step, timeout=5)
    b = replica("controller-b")
    assert a.step() and a.step() and not b.step()
    pods = sorted(fake.pods_of(name, "team-a"))
    assert len(pods) == 2

    # a's next step stalls just after it was told it leads (a GC pause, a frozen VM)...
    stalled, resume, stepped = threading.Event(), threading.Event(), []
    reconcile = a._reconcile

    def stalling_reconcile(*args: Any) -> None:
        stalled.set()
        resume.wait(timeout=30)
        reconcile(*args)

    a._reconcile = stalling_reconcile  # type: ignore[method-assign]
    a.queue.add(("team-a", name))
    stalling = threading.Thread(target=lambda: stepped.append(a.step()))
    stalling.start()
    assert stalled.wait(timeout=5)
    freeze(a, store)  # ...long enough that its lease lapsed: b takes the Lease and the epoch, and acts
    assert wait_until(b.step, timeout=LEASE + 2)
    assert b.step()
    before = etcd_state(store, name)
    fake.set_pod(pods[1], "Failed", 1, namespace="team-a")  # something a would act on

    resume.set()  # a wakes up mid-step, sure it leads
    stalling.join(timeout=10)
    assert stepped == [False], "a's resumed step was refused (NotLeaderError), not carried out"
    assert etcd_state(store, name) == before, "a wrote nothing to etcd"
    assert sorted(fake.pods_of(name, "team-a")) == pods, "a neither created nor deleted a pod"
    assert a.step() is False and a.controllers == {}

    # the leader handles the failure, once
    assert wait_until(lambda: b.step() and pods[1] not in fake.pods_of(name, "team-a"), timeout=5)
    assert len(fake.pods_of(name, "team-a")) == 2


def test_a_replica_that_loses_the_lease_gives_its_etcd_epoch_up_at_once(fake: FakeApiServer, replicas: tuple) -> None:
    store, replica = replicas
    told: list[str] = []
    a = replica("controller-a", on_lost=told.append)  # in production: exit_on_loss
    assert wait_until(a.step, timeout=5)
    assert store.get(controller_leader_key("kubernetes")) is not None
    leases = KubernetesLeases(client.CoordinationV1Api(a.core.api_client), timeout=5)  # another replica's
    body = lease_body("elastic-system", LEASE_NAME, "controller-x", LEASE, a.elector.read(), True, 0.0)
    leases.replace("elastic-system", LEASE_NAME, body)

    assert wait_until(lambda: told, timeout=LEASE), "a's renew thread saw the foreign holder"
    assert told == ["elastic-system/elastic-controller is now held by controller-x"]
    assert not a.leadership.acting
    assert store.get(controller_leader_key("kubernetes")) is None, "the epoch was given up on the renew thread"
    assert a.step() is False


# A controller process as `run_kubernetes_controller` makes it (on_lost=exit_on_loss), whose main thread then
# stalls for good: only its renew thread can notice the loss and end it.
STALLED_CONTROLLER = """
import sys, threading
from kubernetes import client
from elastic.cluster.kubernetes import BoundedApiClient
from elastic.controller.machinery.kube_leadership import exit_on_loss
from elastic.controller.kube_manager import KubernetesControllerManager
from elastic.store import Store
api, etcd = sys.argv[1:3]
api_client = BoundedApiClient(client.Configuration(host=api))
manager = KubernetesControllerManager(Store(etcd, retry_seconds=5), etcd, api_client, "controller-p", "elastic-system",
                                      lease_seconds=2, on_lost=exit_on_loss).start()
while not manager.step():
    threading.Event().wait(0.1)
threading.Event().wait()
"""


def test_a_controller_process_exits_when_it_loses_the_lease_even_if_its_main_thread_is_stalled(
    fake: FakeApiServer, api_client: client.ApiClient, etcd_server: EtcdServer
) -> None:
    command = [sys.executable, "-c", STALLED_CONTROLLER, fake.url, etcd_server.client_url]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with Store(etcd_server.client_url, retry_seconds=5) as store:
        try:
            leads = lambda: (store.get_json(controller_leader_key("kubernetes")) or {}).get("pid") == process.pid  # noqa: E731
            assert wait_until(leads, timeout=20), "the controller took the Lease and the etcd epoch"
            leases = KubernetesLeases(client.CoordinationV1Api(api_client), timeout=5)
            current = parse_lease(leases.get("elastic-system", LEASE_NAME) or {})
            body = lease_body("elastic-system", LEASE_NAME, "controller-x", LEASE, current, True, 0.0)
            leases.replace("elastic-system", LEASE_NAME, body)  # another replica took it over

            assert process.wait(timeout=LEASE + 5) == EXIT_LOST_LEADERSHIP
            _, err = process.communicate()
            assert "controller lost leadership (elastic-system/elastic-controller is now held by controller-x)" in err
            assert store.get(controller_leader_key("kubernetes")) is None, "the epoch was given up before the exit"
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            store.delete(controller_leader_key("kubernetes"))
