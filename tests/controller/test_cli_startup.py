"""The verbs that only read (and `--version`, `validate`, `completion`) never import torch: its import alone
takes seconds on a loaded machine, which every `elastic status` and every completion of a job name paid."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cli_harness import REPO

from elastic.controller.submit import submit_job
from elastic.spec import load_job
from elastic.store import Store

PROBE = """
import sys
from elastic.cli.main import main
try:
    code = main(sys.argv[1:])
except SystemExit as exit_:
    code = exit_.code
assert "torch" not in sys.modules, "torch was imported"
sys.exit(code)
"""


def test_importing_the_cli_imports_no_torch() -> None:
    probe = "import elastic.cli.main, sys; assert 'torch' not in sys.modules, 'torch was imported'"
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("module", ["elastic.controller.manager", "elastic.controller.kube_manager"])
def test_the_controllers_import_no_torch(module: str) -> None:
    """A controller starts no training process of its own: torch would cost it 160 MiB and seconds to start."""
    probe = f"import {module}, sys; assert 'torch' not in sys.modules, 'torch was imported'"
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("argv", [
    ["--version"],
    ["status"],
    ["status", "train-ddp", "-o", "yaml"],
    ["describe", "train-ddp"],
    ["logs", "train-ddp"],
    ["validate", "examples/elasticjob.yaml"],
    ["completion", "bash"],
], ids=" ".join)  # fmt: skip
def test_a_verb_that_runs_no_training_imports_no_torch(argv: list[str], etcd_server) -> None:
    with Store(etcd_server.client_url) as store:
        if store.get("/elastic/jobs/default/train-ddp/spec") is None:
            submit_job(store, load_job(REPO / "examples" / "elasticjob.yaml"))
    uses_etcd = argv[0] in ("status", "describe", "logs")
    done = subprocess.run([sys.executable, "-c", PROBE, *argv, *(["--etcd", etcd_server.client_url] * uses_etcd)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert "torch was imported" not in done.stderr, done.stderr
    # logs: no worker was started, so there is no log to show (one error line), but nothing imported torch
    assert done.returncode == (1 if argv[0] == "logs" else 0), done.stdout + done.stderr
