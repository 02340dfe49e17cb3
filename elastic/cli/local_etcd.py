"""This user's local etcd: the one `elastic run` starts and leaves running, so that a finished job can still
be inspected, and that every command on this machine finds without `--etcd`.

It lives under the user's state directory (`$XDG_STATE_HOME/elastic`, else `~/.local/state/elastic`): the
data in `etcd/` (reused by the next start, so jobs of earlier runs stay visible), its log in `etcd.log`,
and where it serves in `etcd-endpoint` (its client URL, the etcd server's pid, the data directory). A
record whose process is gone, or whose pid now belongs to another program, is no default: a stale address
is never used. Starting takes a lock, so two `elastic run`s started at once share one etcd.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from elastic.cluster.processes import is_running
from elastic.store.server import EtcdServer

STATE_ENV = "XDG_STATE_HOME"
STOP_SECONDS = 10.0  # etcd flushes its WAL on SIGTERM within a second; then it is killed


def state_dir() -> Path:
    """Where this user's local etcd keeps its data, log and address (the XDG base directory for state)."""
    return Path(os.environ.get(STATE_ENV) or Path.home() / ".local" / "state") / "elastic"


def endpoint_file() -> Path:
    return state_dir() / "etcd-endpoint"


def default_data_dir() -> Path:
    return state_dir() / "etcd"


@dataclass(frozen=True)
class LocalEtcd:
    """A running local etcd as its record says: where it serves, its server's pid, its data directory."""

    url: str
    pid: int
    data_dir: Path

    def alive(self) -> bool:
        """The pid is running and is this etcd (pids are reused: an unrelated process is never signalled)."""
        if not is_running(self.pid):
            return False
        try:
            command = Path(f"/proc/{self.pid}/cmdline").read_bytes()
        except OSError:
            return False
        return f"--listen-client-urls={self.url}".encode() in command.split(b"\0")


def write_endpoint(server: EtcdServer) -> Path:
    """Record a started server as this user's local etcd."""
    assert server.process is not None, "record a started server"
    path = endpoint_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{server.client_url}\n{server.process.pid}\n{server.data_dir}\n")
    return path


def running() -> LocalEtcd | None:
    """The local etcd that runs now, else None."""
    try:
        url, pid, data_dir = endpoint_file().read_text().splitlines()[:3]
    except (OSError, ValueError):
        return None
    found = LocalEtcd(url, int(pid), Path(data_dir)) if pid.isdigit() else None
    return found if found is not None and found.alive() else None


def read_endpoint() -> str | None:
    """The URL of the local etcd that runs now, else None."""
    found = running()
    return found.url if found else None


def remove_endpoint(url: str) -> None:
    """Remove the record if it still names `url` (an etcd started since keeps its own)."""
    path = endpoint_file()
    with contextlib.suppress(OSError, IndexError):
        if path.read_text().split()[0] == url:
            path.unlink()


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One start at a time among this user's processes, so that two of them never start two etcds."""
    state_dir().mkdir(parents=True, exist_ok=True)
    with (state_dir() / "etcd.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def start(data_dir: Path | None = None, port: int | None = None) -> tuple[LocalEtcd, EtcdServer | None]:
    """The local etcd, started in a session of its own (it outlives this process and a Ctrl-C of its
    terminal) if none runs. Returns it and the server when this call started it (None: it ran already)."""
    with _locked():
        found = running()
        if found is not None:
            return found, None
        server = EtcdServer(data_dir=data_dir or default_data_dir(), client_port=port)
        server.data_dir.mkdir(parents=True, exist_ok=True)
        server.start()
        write_endpoint(server)
        assert server.process is not None
        return LocalEtcd(server.client_url, server.process.pid, server.data_dir), server


def stop(timeout: float = STOP_SECONDS) -> LocalEtcd | None:
    """Stop the local etcd (SIGTERM, SIGKILL after `timeout`); its data stays. Returns what was stopped."""
    found = running()
    if found is None:
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(found.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while found.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if found.alive():
        with contextlib.suppress(ProcessLookupError):
            os.kill(found.pid, signal.SIGKILL)
    remove_endpoint(found.url)
    return found


def how_to_start() -> str:
    """What to do when a command needs an etcd and none was given or runs here."""
    return ("no etcd given (--etcd URL or $ELASTIC_ETCD) and no local etcd runs on this machine (none recorded in "
            f"{endpoint_file()}): start one with 'elastic etcd start' (it keeps running), or run a job with "
            "'elastic run JOB.yaml', which starts it")
