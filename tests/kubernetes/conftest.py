"""Fixtures for the Kubernetes backend: the fake API server and real `kubernetes` clients pointed at it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fake_api import FakeApiServer
from kube_harness import harness  # noqa: F401 - a fixture shared by the Kubernetes tests
from kubernetes import client

from elastic.cluster.kubernetes import BoundedApiClient


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The real-cluster suite runs only when asked for by name (`-m realcluster`): a developer's kubeconfig
    may well point at a cluster nobody wants test objects in."""
    if "realcluster" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="a real cluster only with -m realcluster (see tests/kubernetes/test_realcluster.py)")
    for item in items:
        if "realcluster" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    yield server
    server.stop()


@pytest.fixture
def api_client(fake: FakeApiServer) -> Iterator[client.ApiClient]:
    """The controller's service account, with the controller's client: every request bounded, no retries."""
    with BoundedApiClient(client.Configuration(host=fake.url)) as api:
        yield api


@pytest.fixture
def admin_client(fake: FakeApiServer) -> Iterator[client.ApiClient]:
    """The user, as kubectl would be: a cluster admin (the fake enforces RBAC on the controller's account)."""
    configuration = client.Configuration(host=fake.url)
    with client.ApiClient(configuration, header_name="Authorization", header_value="Bearer admin") as api:
        yield api


@pytest.fixture
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture
def custom(api_client: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


@pytest.fixture
def coordination(api_client: client.ApiClient) -> client.CoordinationV1Api:
    return client.CoordinationV1Api(api_client)
