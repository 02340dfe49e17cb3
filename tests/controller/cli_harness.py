"""`elastic run` / `elastic controller` as real processes against a real etcd, with real workers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from elastic.cluster.processes import pids_with_env
from elastic.store import JobKeys, Store
from elastic.store.server import EtcdServer
from harness.agents import Step, parse_steps

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "train_ddp.py"  # the spec is written elsewhere: its worker starts there


def job_yaml(name: str, script_args: list[str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "elastic.dev/v1alpha1",
        "kind": "ElasticJob",
        "metadata": {"name": name},
        "spec": {
            "minReplicas": 2, "maxReplicas": 3, "replicas": 2,
            "worker": {"command": ["python", str(SCRIPT)],
                       "args": ["--step-seconds", "0.05", "--checkpoint-every", "5", *script_args]},
            "rendezvous": {"leaseSeconds": 3, "lastCallSeconds": 1},
            **spec,
        },
    }  # fmt: skip


class ElasticCli:
    """Runs `elastic ...` commands against one etcd, from the repository root (where the YAML paths point)."""

    def __init__(self, etcd: EtcdServer, tmp: Path) -> None:
        self.etcd = etcd
        self.tmp = tmp
        self.store = Store(etcd.client_url)
        self.processes: list[subprocess.Popen[str]] = []

    def write(self, job: dict[str, Any]) -> Path:
        path = self.tmp / f"{job['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(job))
        return path

    def start(self, *args: str, cwd: Path = REPO) -> subprocess.Popen[str]:
        log = (self.tmp / f"cli-{len(self.processes)}.log").open("w")
        process = subprocess.Popen(
            [sys.executable, "-m", "elastic.cli.main", *args, "--etcd", self.etcd.client_url],
            cwd=cwd, stdout=log, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        process.log_path = log.name  # type: ignore[attr-defined]
        self.processes.append(process)
        return process

    def run(self, *args: str, timeout: float = 60, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "elastic.cli.main", *args, "--etcd", self.etcd.client_url],
            cwd=cwd, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def output(self, process: subprocess.Popen[str]) -> str:
        return Path(process.log_path).read_text()  # type: ignore[attr-defined]

    def status(self, name: str) -> dict[str, Any]:
        return self.store.get_json(JobKeys("default", name).status) or {}

    def budget(self, name: str) -> dict[str, Any]:
        return self.store.get_json(JobKeys("default", name).budget) or {}

    def steps(self, log_dir: Path) -> list[Step]:
        steps = []
        for log in log_dir.glob("*.log"):
            steps += parse_steps(log.read_text(errors="replace"))
        return sorted(steps, key=lambda s: s.time)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
        self.store.close()


def processes_of(job_name: str) -> list[int]:
    """Live processes (agents and training processes) that belong to a job's workers."""
    return pids_with_env(f"ELASTIC_WORKER={job_name}-")
