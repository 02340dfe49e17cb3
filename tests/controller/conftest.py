"""Fixtures of the controller stories."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_harness import ElasticCli

from elastic.store.server import EtcdServer


@pytest.fixture
def cli(etcd_server: EtcdServer, tmp_path: Path) -> Iterator[ElasticCli]:
    runner = ElasticCli(etcd_server, tmp_path)
    yield runner
    runner.stop()
