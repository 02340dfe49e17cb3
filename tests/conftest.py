"""The whole suite's ground rules: the fixtures of harness.fixtures, and a state directory of its own."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastic.cli import local_etcd

pytest_plugins = ["harness.fixtures"]

# A suite started in the background of a script (`make test &`, a CI runner's non-interactive shell) inherits
# SIGINT ignored, and so would every command it starts: `elastic run` would never see the Ctrl-C the tests
# send it, and a script's own handlers would differ from torchrun's. A handled signal is reset to its default
# across exec, so handling it here gives every child the disposition a terminal would.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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
