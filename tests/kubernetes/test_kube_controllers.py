"""Two controller replicas (`elastic controller --backend kubernetes`) with leader election.

Against a FAKE API server (tests/kubernetes/fake_api.py; no kube-apiserver can run here) through the real
`kubernetes` client, and a real etcd. The test plays the kubelet (pod phases set in the fake's store) and
"kills" a replica by no longer stepping it. A real-cluster test would add two controller pods of the
Deployment, a real pod kill, and the API server's own Lease semantics and RBAC enforcement.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import yaml
from fake_api import FakeApiServer, rbac_allows
from kubernetes import client

from elastic.agents import seconds_until
from elastic.controller.kube_manager import KubernetesControllerManager
from elastic.spec import parse_job
from elastic.store import JobKeys, Store
from elastic.store.server import EtcdServer


def test_only_the_leader_reconciles_and_the_other_takes_over(
    fake: FakeApiServer, api_client: client.ApiClient, etcd_server: EtcdServer
) -> None:
    name = f"lj-{uuid.uuid4().hex[:6]}"
    stored = fake.add_job(
        {
            "apiVersion": "elastic.dev/v1alpha1",
            "kind": "ElasticJob",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"minReplicas": 2, "maxReplicas": 2, "worker": {"command": ["python", "t.py"], "image": "i:1"}},
        }
    )
    with Store(etcd_server.client_url, retry_seconds=5) as store:
        url = etcd_server.client_url
        a = KubernetesControllerManager(store, url, api_client, "controller-a", "elastic-system", lease_seconds=2)
        b = KubernetesControllerManager(store, url, api_client, "controller-b", "elastic-system", lease_seconds=2)
        for _ in range(3):
            assert a.step() is True
            assert b.step() is False
        pods = sorted(fake.pods_of(name, "team-a"))
        assert len(pods) == 2 and b.controllers == {}  # two workers, not four: b reconciled nothing
        # the spec went to etcd with the object's uid as the run id
        spec = store.get_json(JobKeys("team-a", name).spec)
        assert parse_job(spec).metadata.uid == stored["metadata"]["uid"]
        assert fake.jobs[("team-a", name)]["status"]["phase"] == "Created"

        # controller-a is killed (it steps no more): controller-b leads once the lease expired
        waited = seconds_until(b.step, timeout=2 + 1.5)
        assert waited <= 2 + 1.0
        b.step()
        assert sorted(fake.pods_of(name, "team-a")) == pods  # adopted, not duplicated
        fake.set_pod(pods[1], "Failed", 1, namespace="team-a")
        b.step()
        now = sorted(fake.pods_of(name, "team-a"))
        assert pods[0] in now and pods[1] not in now and len(now) == 2  # the new leader replaced it
        assert a.step() is False and a.controllers == {}  # the old leader, back, follows
    rbac = list(yaml.safe_load_all((Path(__file__).resolve().parents[2] / "manifests" / "rbac.yaml").read_text()))
    assert set(fake.requests) <= rbac_allows(rbac)
