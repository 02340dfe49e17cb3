"""The docker-compose cluster for real (issue 24): images built here, `up --scale worker=3`, a worker killed
with `docker kill`, the killed worker started again, a spent budget, `down -v`. Everything is checked where a
user would look: in etcd (published on a loopback port of the host) and in the containers' states and logs.

Needs a Docker daemon and docker-compose (`docker/daemon.sh up` starts a daemon as root; CI does); skipped
with the reason elsewhere. Images: $BASE_IMAGE/$ETCD_IMAGE when set, else made here from Debian packages
(docker/local-images.sh, root + debootstrap), else the public defaults (the daemon pulls them).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from elastic.store.client import Store
from harness.agents import wait_until

ROOT = Path(__file__).resolve().parents[2]
KEYS = "/elastic/jobs/default/compose-demo/"
pytestmark = [pytest.mark.slow, pytest.mark.compose, pytest.mark.timeout(1200)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _docker_answers() -> bool:
    docker = shutil.which("docker")
    return docker is not None and subprocess.run([docker, "info"], capture_output=True, timeout=60).returncode == 0


def _images() -> dict[str, str]:
    if os.environ.get("BASE_IMAGE") and os.environ.get("ETCD_IMAGE"):
        return {"BASE_IMAGE": os.environ["BASE_IMAGE"], "ETCD_IMAGE": os.environ["ETCD_IMAGE"]}
    if os.geteuid() == 0 and shutil.which("debootstrap"):
        made = subprocess.run([str(ROOT / "docker/local-images.sh")], capture_output=True, text=True, timeout=900)
        assert made.returncode == 0, made.stderr
        print(made.stderr, end="")
        return dict(re.findall(r"(\w+)=(\S+)", made.stdout.strip().removeprefix("export ")))
    return {}  # the compose file's public defaults


class Cluster:
    """One compose project of the repository's docker-compose.yml, on a port and under a name of its own."""

    def __init__(self, images: dict[str, str], job_spec: Path) -> None:
        self.port = _free_port()
        self.project = f"elastic-e2e-{os.getpid()}"
        self.env = {**os.environ, **images, "ETCD_HOST_PORT": str(self.port), "JOB_SPEC": str(job_spec),
                    "STEPS": "100000"}
        self.store: Store | None = None

    def compose(self, *args: str, timeout: float = 600) -> str:
        done = subprocess.run(["docker-compose", "-p", self.project, *args], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"docker-compose {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def etcd(self) -> Store:
        if self.store is None:
            self.store = Store(f"http://127.0.0.1:{self.port}", retry_seconds=5)
        return self.store

    def get(self, name: str) -> Any:
        return self.etcd().get_json(KEYS + name)

    def workers(self, running: bool = True) -> list[str]:
        labels = [f"label=com.docker.compose.project={self.project}", "label=com.docker.compose.service=worker"]
        args = ["docker", "ps", "-q", "--no-trunc", *(a for label in labels for a in ("--filter", label))]
        if not running:
            args.insert(2, "-a")
        return subprocess.run(args, capture_output=True, text=True, check=True).stdout.split()

    def logs(self) -> str:
        return subprocess.run(["docker-compose", "-p", self.project, "logs", "--no-color", "worker"], cwd=ROOT,
                              env=self.env, capture_output=True, text=True, timeout=120).stdout

    def status(self) -> dict[str, Any]:
        return self.get("status") or {}

    def elastic(self, *args: str, exit_code: int = 0) -> str:
        """`elastic ...` on the host, against the cluster's etcd (published on a loopback port)."""
        done = subprocess.run([sys.executable, "-m", "elastic.cli.main", *args, "--etcd",
                               f"http://127.0.0.1:{self.port}"], capture_output=True, text=True, timeout=60)
        assert done.returncode == exit_code, done.stdout + done.stderr
        return done.stdout + done.stderr

    def round(self) -> dict[str, Any]:
        return self.get("round") or {}

    def trains_at(self, world: int, after_round: int = -1) -> bool:
        current = self.round()
        return bool(current.get("sealed")) and current.get("world_size") == world and current["round"] > after_round

    def leftovers(self) -> list[str]:
        label = f"label=com.docker.compose.project={self.project}"
        found = []
        for kind in (["ps", "-a"], ["network", "ls"], ["volume", "ls"]):
            out = subprocess.run(["docker", *kind, "-q", "--filter", label], capture_output=True, text=True).stdout
            found += [f"{kind[0]} {name}" for name in out.split()]
        return found


def _state(container: str) -> tuple[str, int]:
    out = subprocess.run(["docker", "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", container],
                         capture_output=True, text=True, check=True).stdout.split()
    return out[0], int(out[1])


def _job_spec(directory: Path) -> Path:
    """The compose job's own spec with a budget of 1, mounted into the controller (JOB_SPEC)."""
    spec = yaml.safe_load((ROOT / "examples" / "compose-job.yaml").read_text())
    spec["spec"]["failurePolicy"]["maxRestarts"] = 1
    path = directory / "compose-job.yaml"
    path.write_text(yaml.safe_dump(spec))
    path.chmod(0o644)  # read by the image's non-root user
    return path


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    if shutil.which("docker-compose") is None or not _docker_answers():
        pytest.skip("no Docker daemon answers, or docker-compose is missing: as root, `apt-get install docker.io "
                    "docker-compose` and `docker/daemon.sh up` (CI does both)")
    started = time.monotonic()
    made = Cluster(_images(), _job_spec(tmp_path))
    made.compose("build", timeout=1200)
    print(f"images built in {time.monotonic() - started:.0f} s")
    try:
        yield made
    finally:
        if made.store is not None:
            made.store.close()
        made.compose("down", "-v", "--remove-orphans", "--timeout", "5")
        assert made.leftovers() == [], "down -v left these behind"


def test_compose_cluster_trains_recovers_scales_back_and_closes_on_a_spent_budget(cluster: Cluster) -> None:
    started = time.monotonic()
    cluster.compose("up", "-d", "--scale", "worker=3")
    assert wait_until(lambda: cluster.trains_at(3) and "world_size=3" in cluster.logs(), 300), cluster.logs()
    print(f"training at world 3 {time.monotonic() - started:.1f} s after up")
    assert wait_until(lambda: re.search(r"^\S+\s+\|\s+step=[1-9]\d+ .*world_size=3", cluster.logs(), re.M), 120)
    # the controller submitted the spec and reports the job as it does locally; the host's CLI reads it
    assert cluster.get("run")["run_id"] == "compose-demo" and cluster.get("budget")["max"] == 1
    assert wait_until(lambda: cluster.status().get("replicasText") == "3/3"
                      and cluster.status().get("progress", {}).get("step", 0) > 0, 60), cluster.status()
    row = cluster.elastic("status", "compose-demo").splitlines()[1].split()
    assert row[:5] == ["default/compose-demo", "Running", "3/3", "1", "4"] and row[8].isdigit(), row  # STEP: [8]
    assert "docker-compose logs worker" in cluster.elastic("logs", "compose-demo", exit_code=1)
    first = cluster.round()["round"]

    victim = cluster.workers()[0]
    subprocess.run(["docker", "kill", victim], check=True, capture_output=True)
    killed = time.monotonic()
    assert wait_until(lambda: cluster.trains_at(2, first), 120), (cluster.round(), cluster.logs())
    print(f"new round at world 2 {time.monotonic() - killed:.1f} s after docker kill")
    budget = cluster.get("budget")
    assert budget["used"] == 1, budget
    (charge,) = budget["charges"]
    assert charge["member"].startswith(victim[:12]), (charge, victim)  # a member id starts with its hostname
    assert wait_until(lambda: re.search(r"resumed_from=[1-9]", cluster.logs()), 120), cluster.logs()

    # compose starts the killed container again: a late joiner, a free scale-up back to 3
    second = cluster.round()["round"]
    cluster.compose("up", "-d", "--no-recreate", "--scale", "worker=3")
    back = time.monotonic()
    assert wait_until(lambda: cluster.trains_at(3, second), 180), (cluster.round(), cluster.logs())
    print(f"back at world 3 {time.monotonic() - back:.1f} s after up --scale worker=3")
    assert cluster.get("budget")["used"] == 1, cluster.get("budget")

    # a second failure spends the budget (maxRestarts 1 in JOB_SPEC): the job closes for every agent
    subprocess.run(["docker", "kill", cluster.workers()[0]], check=True, capture_output=True)
    assert wait_until(lambda: cluster.get("closed") is not None, 120), cluster.logs()
    assert cluster.get("closed")["reason"] == "BackoffLimitExceeded", cluster.get("closed")
    assert wait_until(lambda: cluster.status().get("phase") == "Failed", 60), cluster.status()
    assert "BackoffLimitExceeded" in cluster.elastic("describe", "compose-demo")
    assert wait_until(lambda: not cluster.workers(), 120), cluster.logs()
    states = {c[:12]: _state(c) for c in cluster.workers(running=False)}
    assert len(states) == 3 and all(status == "exited" and code != 0 for status, code in states.values()), states
