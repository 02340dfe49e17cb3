"""A worker record that does not decode is never a reason to start a second worker (issue 22): the controller
finds the worker's process by its environment and adopts it; with none running, the worker is gone.
Real etcd, a real process carrying the worker's environment as an agent does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from elastic.cluster.local import LocalProcesses
from elastic.store import JobKeys, Store
from elastic.store.server import EtcdServer


def test_a_garbage_worker_record_adopts_the_running_process_instead_of_doubling_it(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    keys = JobKeys("default", "doubled")
    name = "doubled-ab12"
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             env={**os.environ, "ELASTIC_WORKER": name})  # fmt: skip
    store = Store(etcd_server.client_url)
    try:
        store.put(keys.worker(name), "garbage{")
        workers = LocalProcesses(store, keys, tmp_path / "logs", tmp_path / "ckpt")
        (seen,) = workers.observe()
        assert (seen.name, seen.alive) == (name, True), "the running worker is adopted, so none is started again"
        assert workers.pids() == {name: agent.pid}
        workers.stop(name)
        assert agent.wait(timeout=30) is not None, "an adopted worker can be stopped"
        store.put(keys.worker("doubled-cd34"), "garbage{")  # no process of it runs: it is gone, not adopted
        assert [w.name for w in LocalProcesses(store, keys, tmp_path / "logs", tmp_path / "ckpt").observe()
                if w.alive] == []
    finally:
        agent.kill()
        agent.wait()
        store.delete_prefix(keys.prefix)
        store.close()
