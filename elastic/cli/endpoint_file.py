"""Where a local `elastic etcd` says it serves, so that commands find it without `--etcd`/`$ELASTIC_ETCD`.

`elastic etcd` writes its client URL and its pid to one file (`~/.elastic/etcd-endpoint`, or
`$ELASTIC_ENDPOINT_FILE`) and removes it when it stops. A file whose pid is no longer running (an etcd
killed outright) is ignored, so a stale address is never a default.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from elastic.cluster.processes import is_running

ENDPOINT_FILE_ENV = "ELASTIC_ENDPOINT_FILE"


def endpoint_file() -> Path:
    return Path(os.environ.get(ENDPOINT_FILE_ENV) or Path.home() / ".elastic" / "etcd-endpoint")


def write_endpoint(url: str, pid: int | None = None) -> Path:
    path = endpoint_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{url}\n{pid or os.getpid()}\n")
    return path


def read_endpoint() -> str | None:
    """The URL a live local `elastic etcd` wrote, else None."""
    try:
        url, pid = endpoint_file().read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return url if pid.isdigit() and is_running(int(pid)) else None


def remove_endpoint(url: str) -> None:
    """Remove the file if it still names `url` (another `elastic etcd` started since keeps its own)."""
    path = endpoint_file()
    with contextlib.suppress(OSError, ValueError):
        if path.read_text().split()[0] == url:
            path.unlink()
