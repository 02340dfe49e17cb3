"""A 3-member etcd cluster, one member per test host (`harness.hosts`), for partitions of etcd itself.

Members listen for clients on their host's address, port 2379, and for peers on port 2380; the client
endpoint list names all three, so a client whose member is cut off moves to another (both store wires fail
over). `leader()` asks each member's status over its own host (`etcdctl endpoint status`).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from elastic.store.server import find_etcd_binary
from harness.hosts import Host

CLIENT_PORT, PEER_PORT = 2379, 2380


class EtcdCluster:
    def __init__(self, hosts: list[Host], data_root: Path) -> None:
        self.hosts = hosts
        self.binary = find_etcd_binary()
        self.processes: list[subprocess.Popen[bytes]] = []
        self.data_root = data_root
        self.token = f"elx-{time.time_ns()}"

    @property
    def endpoints(self) -> str:
        return ",".join(self.url(h) for h in self.hosts)

    @staticmethod
    def url(host: Host, port: int = CLIENT_PORT) -> str:
        return f"http://{host.address}:{port}"

    def start(self, timeout: float = 60.0) -> EtcdCluster:
        initial = ",".join(f"{h.name}={self.url(h, PEER_PORT)}" for h in self.hosts)
        for host in self.hosts:
            log = (self.data_root / f"etcd-{host.name}.log").open("ab")
            command = [
                str(self.binary), "--name", host.name, "--data-dir", str(self.data_root / f"etcd-{host.name}"),
                "--listen-client-urls", self.url(host), "--advertise-client-urls", self.url(host),
                "--listen-peer-urls", self.url(host, PEER_PORT),
                "--initial-advertise-peer-urls", self.url(host, PEER_PORT),
                "--initial-cluster", initial, "--initial-cluster-state", "new",
                "--initial-cluster-token", self.token,
            ]
            self.processes.append(subprocess.Popen(host.command(command), stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout
        while self.leader() is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the etcd cluster elected no leader in {timeout:g} s (logs in {self.data_root})")
            time.sleep(0.2)
        return self

    def status(self, host: Host) -> dict[str, object] | None:
        """The member's own status, asked on its host (None: it does not answer)."""
        etcdctl = str(self.binary.parent / "etcdctl")
        done = subprocess.run(host.command([etcdctl, f"--endpoints={self.url(host)}", "--command-timeout=2s",
                                            "endpoint", "status", "-w", "json"]),
                              capture_output=True, text=True, timeout=30, env={**os.environ, "ETCDCTL_API": "3"})
        if done.returncode != 0:
            return None
        found = json.loads(done.stdout)
        return found[0]["Status"] if found else None

    def leader(self) -> Host | None:
        """The member that leads, by its own account (None while there is none)."""
        for host in self.hosts:
            status = self.status(host)
            if status and status["leader"] == status["header"]["member_id"]:
                return host
        return None

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()
        self.processes.clear()
