"""Fixtures of the store tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from elastic.store import GatewayStore, Store, StoreBase
from elastic.store.server import EtcdServer
from harness.fixtures import available_etcd_binaries


@pytest.fixture(params=sorted(available_etcd_binaries().items()), ids=lambda p: f"etcd{p[0]}")
def own_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EtcdServer]:
    """A server this test may kill and restart."""
    server = EtcdServer(binary=request.param[1], data_dir=tmp_path / "etcd").start()
    yield server
    server.stop()


WIRES = {"grpc": Store, "gateway": GatewayStore}  # controllers use gRPC; agents and training processes the gateway


@pytest.fixture(params=sorted(WIRES))
def wire(request: pytest.FixtureRequest) -> type[StoreBase]:
    """Each store class in turn: a test that takes it holds for both wires."""
    return WIRES[request.param]
