"""The controller survives its API server (issue 23): a server that stops answering, connections reset,
random errors. Nothing of the API server's state ends the process or loses a job; a controller that cannot
hear the server says so on /healthz, so the kubelet restarts it if that lasts.

Against the FAKE API server (fake_api.py: blackhole, resets, seeded random faults) through the real
`kubernetes` client, and a real etcd. The controller's loop runs on a thread as `run_forever` runs it; an
exception escaping a pass is what would end the process, so each one is recorded as an exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fake_api import FakeApiServer
from kubernetes import client

from elastic.cluster.kubernetes import BoundedApiClient
from elastic.controller.kube_manager import JOB_FINALIZER, KubernetesControllerManager, serve_health
from elastic.store import JobKeys, Store
from elastic.store.keys import controller_leader_key
from elastic.store.server import EtcdServer, free_port
from harness.agents import wait_until

WATCH_READ = 1.5  # the watches' read timeout (the fake bookmarks every second)
STALE = 3.0  # /healthz fails past this


class Loop:
    """`run_forever`'s loop on a thread (its passes, as it takes them): every exception that escapes a pass
    would have been an exit."""

    def __init__(self, manager: KubernetesControllerManager) -> None:
        self.manager = manager
        self.exits: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.manager.step_through_outages(0.1)
            except Exception as err:
                self.exits.append(err)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


@contextlib.contextmanager
def running_controller(
    fake: FakeApiServer, etcd: EtcdServer, name: str
) -> Iterator[tuple[KubernetesControllerManager, Loop]]:
    """One replica with short deadlines (1 s per request), its loop running."""
    api = BoundedApiClient(client.Configuration(host=fake.url), timeout=(1.0, 1.0))
    with api, Store(etcd.client_url, retry_seconds=5) as store:
        manager = KubernetesControllerManager(
            store, etcd.client_url, api, name, "elastic-system", lease_seconds=30,
            watch_read_seconds=WATCH_READ, stale_seconds=STALE,
        ).start()  # fmt: skip
        loop = Loop(manager)
        try:
            yield manager, loop
        finally:
            loop.stop()
            manager.close()
            store.delete(controller_leader_key("kubernetes"))


@pytest.fixture
def controller(fake: FakeApiServer, etcd_server: EtcdServer) -> Iterator[tuple[KubernetesControllerManager, Loop]]:
    with running_controller(fake, etcd_server, "controller-o") as running:
        yield running


def job_doc(name: str, replicas: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "elastic.dev/v1alpha1", "kind": "ElasticJob",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"minReplicas": 1, "maxReplicas": 3, "replicas": replicas,
                 "worker": {"command": ["python", "t.py"], "image": "i:1"}},
    }  # fmt: skip


def reconciled(fake: FakeApiServer, name: str, pods: int) -> bool:
    """The job's pods are what its spec asks, and its status says the controller acted on that spec."""
    with fake.lock:
        obj = fake.jobs.get(("team-a", name))
        if obj is None:
            return False
        observed = (obj.get("status") or {}).get("observedGeneration")
        finalized = JOB_FINALIZER in (obj["metadata"].get("finalizers") or [])
    return finalized and observed == obj["metadata"]["generation"] and len(fake.pods_of(name, "team-a")) == pods


def probe(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_a_blackholed_api_server_fails_healthz_and_every_job_is_reconciled_within_10_s_once_it_is_back(
    fake: FakeApiServer, controller: tuple[KubernetesControllerManager, Loop]
) -> None:
    manager, loop = controller
    port = free_port()
    health = serve_health(port, manager.ready, manager.unhealthy)
    try:
        names = [f"o{i}-{uuid.uuid4().hex[:5]}" for i in range(3)]
        for name in names:
            fake.add_job(job_doc(name))
        assert wait_until(lambda: all(reconciled(fake, n, 2) for n in names), timeout=20)
        assert probe(port) == 200

        fake.blackhole()
        cut = time.monotonic()
        assert wait_until(lambda: probe(port) == 503, timeout=STALE + WATCH_READ + 3), "still healthy when cut off"
        print(f"unhealthy {time.monotonic() - cut:.1f} s after the blackhole began")
        for name in names:  # the user scales every job meanwhile (kubectl scale, as an admin)
            with fake.lock:
                obj = fake.jobs[("team-a", name)]
                fake._write("elastic.dev", "elasticjobs", "team-a", name,
                            {**obj, "spec": {**obj["spec"], "replicas": 3}}, None)  # fmt: skip
        late = f"late-{uuid.uuid4().hex[:5]}"
        fake.add_job(job_doc(late))

        fake.restore()
        back = time.monotonic()
        assert wait_until(lambda: all(reconciled(fake, n, 3) for n in names) and reconciled(fake, late, 2),
                          timeout=10), "every job reconciled within 10 s of the server's return"  # fmt: skip
        print(f"every job reconciled {time.monotonic() - back:.1f} s after the server came back")
        assert wait_until(lambda: probe(port) == 200, timeout=STALE)
        assert loop.exits == []
    finally:
        health.shutdown()
        health.server_close()


def test_random_api_errors_cost_no_exit_and_no_job(
    fake: FakeApiServer, controller: tuple[KubernetesControllerManager, Loop], etcd_server: EtcdServer
) -> None:
    _, loop = controller
    # 0.15: at a higher rate the last job left draws every remaining fault, and its backoff (doubling to 60 s)
    # makes the test minutes long without testing anything more.
    fake.random_faults(seed=23, count=30, probability=0.15)
    names = [f"r{i}-{uuid.uuid4().hex[:5]}" for i in range(4)]
    for name in names:
        fake.add_job(job_doc(name))
    # A job hit several times in a row waits out its backoff (up to 60 s, the work queue's cap) once more.
    assert wait_until(lambda: all(reconciled(fake, n, 2) for n in names), timeout=120), {
        n: sorted(fake.pods_of(n, "team-a")) for n in names}  # fmt: skip
    for name in names[:2]:
        fake.delete_job(name, "team-a")
    with Store(etcd_server.client_url, retry_seconds=5) as store:

        def cleaned_up(name: str) -> bool:
            return ("team-a", name) not in fake.jobs and not store.get_prefix(JobKeys("team-a", name).prefix)[0]

        assert wait_until(lambda: all(cleaned_up(n) for n in names[:2]), timeout=120)
    assert all(reconciled(fake, n, 2) for n in names[2:])
    print(f"{len(fake.injected)} faults injected: {fake.injected}")
    assert len(fake.injected) >= 8 and loop.exits == []


def test_a_paused_etcd_is_a_wait_said_once_and_every_job_is_reconciled_once_it_answers(
    fake: FakeApiServer, stoppable_etcd_server: EtcdServer
) -> None:
    """No process dies of an etcd outage (issue 41): etcd paused for 3 x the store's retry bound (5 s here)
    costs the controller no exit; it says so once, and what changed meanwhile is reconciled when etcd is back."""
    etcd = stoppable_etcd_server
    said: list[str] = []
    with running_controller(fake, etcd, "controller-e") as (manager, loop):
        manager.outage.say = said.append
        name = f"e-{uuid.uuid4().hex[:5]}"
        fake.add_job(job_doc(name))
        assert wait_until(lambda: reconciled(fake, name, 2), timeout=20)
        assert etcd.process is not None
        os.kill(etcd.process.pid, signal.SIGSTOP)
        try:
            with fake.lock:  # the user scales the job meanwhile
                obj = fake.jobs[("team-a", name)]
                fake._write("elastic.dev", "elasticjobs", "team-a", name,
                            {**obj, "spec": {**obj["spec"], "replicas": 3}}, None)  # fmt: skip
            assert not wait_until(lambda: loop.exits, timeout=15), loop.exits  # the outage: 3 x 5 s
        finally:
            os.kill(etcd.process.pid, signal.SIGCONT)
        assert wait_until(lambda: reconciled(fake, name, 3), timeout=30), "reconciled once etcd answers"
        assert loop.exits == []
        assert [line.split(" since ")[0].split(" after ")[0] for line in said] == [
            "etcd is unreachable", "etcd answers again"], said
