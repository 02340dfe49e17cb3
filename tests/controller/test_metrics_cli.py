"""`--metrics-port` refusals: a bad port is a usage line, a port in use one error line, before anything starts."""

from __future__ import annotations

import socket
import subprocess
import sys

from cli_harness import REPO


def elastic(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "elastic.cli.main", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_a_port_out_of_range_is_a_usage_error() -> None:
    result = elastic("run", "examples/demo-crash.yaml", "--metrics-port", "0")
    assert result.returncode == 2 and "--metrics-port" in result.stderr, result.stderr


def test_a_port_in_use_fails_before_etcd_or_any_worker_starts() -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = elastic("run", "examples/demo-crash.yaml", "--metrics-port", str(port))
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.splitlines()[0].startswith(f"error: --metrics-port {port}: "), result.stderr
    assert "etcd" not in result.stdout and "submitted" not in result.stdout
