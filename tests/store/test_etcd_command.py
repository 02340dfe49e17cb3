"""`elastic etcd` starts a server that etcdctl accepts and stops it on SIGINT, leaving no process."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from elastic.store.server import distro_binary, free_port


def etcdctl() -> str | None:
    distro = distro_binary()
    if distro is not None and (distro.parent / "etcdctl").exists():
        return str(distro.parent / "etcdctl")
    return shutil.which("etcdctl")


def test_elastic_etcd_serves_until_sigint(tmp_path) -> None:
    ctl = etcdctl()
    if ctl is None:
        pytest.skip("no etcdctl on this machine")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "elastic.cli.main", "etcd", "--port", str(port), "--data-dir", str(tmp_path / "d")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}" in first
        health = subprocess.run(
            [ctl, f"--endpoints=http://127.0.0.1:{port}", "endpoint", "health"],
            capture_output=True,
            text=True,
            env={**os.environ, "ETCDCTL_API": "3"},
            timeout=30,
        )
        assert "is healthy" in health.stdout + health.stderr
        etcd_pids = subprocess.run(["pgrep", "-f", f"listen-client-urls=http://127.0.0.1:{port}"],
                                   capture_output=True, text=True).stdout.split()
        assert etcd_pids, "the etcd server process should be running"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in etcd_pids):
            time.sleep(0.05)
        assert not any(os.path.exists(f"/proc/{p}") for p in etcd_pids), "etcd left running after SIGINT"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_one_local_etcd_at_a_time_found_by_status_and_ended_by_stop_from_another_terminal(tmp_path) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}

    def elastic(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "elastic.cli.main", *args], env=env, capture_output=True,
                              text=True, timeout=60)  # fmt: skip

    assert elastic("etcd", "status").returncode == 1, "none runs yet"
    foreground = subprocess.Popen([sys.executable, "-m", "elastic.cli.main", "etcd"], env=env,
                                  stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert foreground.stdout is not None
        first = foreground.stdout.readline()
        assert f"(data: {tmp_path / 'elastic' / 'etcd'})" in first, first
        status = elastic("etcd", "status")
        assert status.returncode == 0 and "etcd serving at http://127.0.0.1:" in status.stdout, status.stderr
        second = elastic("etcd", "start")
        assert second.returncode == 0 and "etcd already runs at" in second.stdout, second.stdout + second.stderr
        again = elastic("etcd")
        assert again.returncode == 1 and "already runs" in again.stderr and "'elastic etcd stop'" in again.stderr
        stopped = elastic("etcd", "stop")
        assert stopped.returncode == 0 and "stopped (data kept in" in stopped.stdout, stopped.stdout
        assert foreground.wait(timeout=30) == 0, "the foreground etcd command ends with its server"
        assert elastic("etcd", "status").returncode == 1
    finally:
        elastic("etcd", "stop")  # on a failure above too: never an etcd left behind
        if foreground.poll() is None:
            foreground.kill()
