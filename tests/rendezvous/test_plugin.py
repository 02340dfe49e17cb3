"""torch finds `etcd-v3` through its `torchrun.handlers` entry point, whatever was imported first."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stdout)
{first}
from torch.distributed.elastic.rendezvous import rendezvous_handler_registry as registry
from elastic.rendezvous.plugin import create_handler
print("registered:", registry._registry.get("etcd-v3") is create_handler)
"""


@pytest.mark.parametrize(
    "first",
    [
        pytest.param("import elastic.rendezvous.plugin", id="the plugin imported before torch's rendezvous"),
        pytest.param("from elastic.rendezvous.plugin import handler_creator", id="its creator imported first"),
        pytest.param("import elastic.rendezvous.handler", id="the handler imported first"),
        pytest.param("import torch.distributed.run", id="torchrun's module imported first"),
    ],
)
def test_etcd_v3_is_registered_whatever_is_imported_first(first: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHECK.format(first=first)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "registered: True" in out.stdout, out.stdout + out.stderr
    assert "Exception while registering out of tree plugin" not in out.stdout + out.stderr
