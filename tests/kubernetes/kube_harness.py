"""The shared arrangement of the Kubernetes backend tests: one ElasticJob on the FAKE API server
(fake_api.py: no kube-apiserver can run here), driven by a real JobController against a real etcd.

`harness` is registered as a fixture by conftest.py; `job_doc`, `_until` are plain helpers.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_api import FakeApiServer, rbac_allows
from kubernetes import client

from elastic.cluster.kubernetes import KubernetesWorkers
from elastic.controller.kube_status import KubeStatus
from elastic.controller.loop import JobController
from elastic.spec import parse_job
from elastic.store import JobKeys, Store
from elastic.store.server import EtcdServer

RBAC = Path(__file__).resolve().parents[2] / "manifests" / "rbac.yaml"


def job_doc(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "elastic.dev/v1alpha1",
        "kind": "ElasticJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "minReplicas": 2, "maxReplicas": 2, "replicas": 2,
            "worker": {"command": ["python", "train.py"], "args": ["--steps", "10"], "image": "example/train:1",
                       "resources": {"limits": {"cpu": "2", "memory": "4Gi"}}},
            "failurePolicy": {"maxRestarts": 3},
            **spec,
        },
    }  # fmt: skip


def _until(condition, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


class Harness:
    """One ElasticJob on the fake cluster, driven by a real JobController against a real etcd."""

    def __init__(self, fake: FakeApiServer, api: client.ApiClient, admin: client.ApiClient, etcd: EtcdServer,
                 **spec: Any) -> None:  # fmt: skip
        self.fake = fake
        self.user = client.CustomObjectsApi(admin)  # what kubectl reads, as a cluster admin
        self.name = f"kj-{uuid.uuid4().hex[:6]}"
        doc = job_doc(self.name, **spec)
        stored = fake.add_job(doc)
        self.job = parse_job({**doc, "metadata": {**doc["metadata"], "uid": stored["metadata"]["uid"]}})
        self.store = Store(etcd.client_url, retry_seconds=5)
        self.keys = JobKeys("default", self.name)
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.workers = KubernetesWorkers(self.core, self.job, "default")
        self.controller = JobController(self.store, self.job, self.workers, etcd.client_url)
        self.kube_status = KubeStatus(self.custom, self.core, self.job)

    def step(self) -> dict[str, Any]:
        status = self.controller.step()
        self.kube_status.publish(status)
        return status

    def pods(self) -> list[str]:
        return sorted(self.fake.pods_of(self.name))

    def start_training(self) -> list[str]:
        """Init the run, create the pods, run them, and seal round 0 with one member per pod."""
        self.step()
        self.step()
        names = self.pods()
        assert len(names) == 2
        for name in names:
            self.fake.set_pod(name, "Running")
        state = self.controller.run.read()
        members = {f"{name}-{100 + i}-ab{i}": i for i, name in enumerate(names)}
        assert self.controller.run.seal(state, state.round, members)
        assert self.step()["phase"] == "Running"
        return names

    def until_done(self, timeout: float = 10) -> dict[str, Any]:
        """Step until the job is done: running pods stop gracefully (the fake's kubelet takes a moment)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.step()
            if self.controller.done():
                return status
            time.sleep(0.05)
        raise AssertionError(f"not done after {timeout} s: {self.controller.status}")

    def budget(self) -> dict[str, Any]:
        return self.store.get_json(self.keys.budget) or {}

    def kube_job(self) -> dict[str, Any]:
        return self.user.get_namespaced_custom_object("elastic.dev", "v1alpha1", "default", "elasticjobs", self.name)

    def reasons(self) -> list[str]:
        return [e["reason"] for e in self.fake.events_for(self.name)]

    def close(self) -> None:
        self.store.close()


@pytest.fixture
def harness(fake: FakeApiServer, api_client: client.ApiClient, admin_client: client.ApiClient, etcd_server: EtcdServer):
    made: list[Harness] = []

    def make(**spec: Any) -> Harness:
        made.append(Harness(fake, api_client, admin_client, etcd_server, **spec))
        return made[-1]

    yield make
    for h in made:
        h.close()
    allowed = rbac_allows(list(yaml.safe_load_all(RBAC.read_text())))
    assert set(fake.requests) <= allowed, f"requests outside manifests/rbac.yaml: {set(fake.requests) - allowed}"
