"""A fork never hangs in the project's own code (issue 44): a process that follows its job as a training
process does (the session's view of the job over etcd, its progress reports) forks thousands of times — bare
`os.fork`, a DataLoader with worker processes per step, `multiprocessing.Pool`, `subprocess` — while etcd is
busy under the job's prefix (its watch thread reads all the while) and busy loops load every core. With gRPC
and its fork support on (the design before), a DataLoader worker waited forever in gRPC's post-fork handler
on a loaded machine; here nothing of gRPC is imported, so no fork handler runs and no lock a child takes is
held. Real etcd, real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from elastic.store.server import EtcdServer

pytestmark = pytest.mark.slow

STRESS = Path(__file__).with_name("fork_stress.py")
FORKS, LOADERS, POOLS, COMMANDS = 2000, 30, 5, 100  # 2,000 + 60 + 10 + 100 forks


def test_thousands_of_forks_under_load_while_following_a_busy_job_never_hang(etcd_server: EtcdServer) -> None:
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        done = subprocess.run(
            [sys.executable, str(STRESS), etcd_server.client_url, "default/fork-stress",
             *(str(n) for n in (FORKS, LOADERS, POOLS, COMMANDS))],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
    finally:
        for loop in busy:
            loop.kill()
            loop.wait()
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["forks"] == FORKS
    assert counts["loader_batches"] == LOADERS * 8  # 64 samples in batches of 8, every batch from a worker
    assert counts["pool_results"] == POOLS * 4 and counts["commands"] == COMMANDS
    assert counts["view_revision"] > 0, "the follower's watch should have been reading the busy job"
    assert counts["grpc_imported"] is False


def test_an_agent_and_a_training_process_import_no_grpc() -> None:
    """What a training script and the agent that hosts the backend load (torchrun finds the handler through
    its entry point; the in-place agent and `elastic agent` import it): gRPC stays out of both."""
    probe = ("import sys, elastic.train, elastic.rendezvous.plugin, elastic.rendezvous.handler, "
             "elastic.inplace.agent, elastic.agent.launcher; "
             "print(sorted(m for m in sys.modules if m == 'grpc' or m.startswith(('grpc.', 'pyetcd'))))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
