"""The whole suite's ground rules: the fixtures of harness.fixtures, and a state directory of its own."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastic.cli import local_etcd

pytest_plugins = ["harness.fixtures"]


@pytest.fixture(scope="session", autouse=True)
def own_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every test, and every command it starts (they inherit the environment), keeps the local etcd's data
    and address in a directory of the session's, never the user's; any local etcd a command left running
    there (`elastic run` keeps one) is stopped when the session ends."""
    state_home = tmp_path_factory.mktemp("state-home")
    before = os.environ.get(local_etcd.STATE_ENV)
    os.environ[local_etcd.STATE_ENV] = str(state_home)
    yield state_home
    local_etcd.stop()
    if before is None:
        del os.environ[local_etcd.STATE_ENV]
    else:
        os.environ[local_etcd.STATE_ENV] = before
