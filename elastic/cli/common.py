"""What several verbs share: the etcd option, connecting, printing status lines."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from elastic.store import Store

ETCD_ENV = "ELASTIC_ETCD"


def add_etcd_option(parser: argparse.ArgumentParser, required: bool = True) -> None:
    default = os.environ.get(ETCD_ENV)
    parser.add_argument(
        "--etcd",
        default=default,
        required=required and default is None,
        metavar="URL",
        help=f"etcd endpoint(s), e.g. http://127.0.0.1:2379[,http://h2:2379] (default: ${ETCD_ENV})",
    )


def connect(url: str) -> Store:
    return Store(url, retry_seconds=5, timeout=2)


class StatusPrinter:
    """One line per visible change of a job: phase, round, world size, replicas, budget, step and loss."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.last: tuple[Any, ...] | None = None

    def __call__(self, status: dict[str, Any], job: str | None = None) -> None:
        progress = status.get("progress", {})
        shown = (
            status.get("phase"),
            status.get("round"),
            status.get("worldSize"),
            status.get("replicasText"),
            status.get("restartsText"),
            progress.get("step"),
        )
        if shown == self.last:
            return
        self.last = shown
        print(format_status_line(status, time.monotonic() - self.started, job), flush=True)


def format_status_line(status: dict[str, Any], elapsed: float | None = None, job: str | None = None) -> str:
    progress = status.get("progress", {})
    parts = [f"[{elapsed:6.1f}s]" if elapsed is not None else "", job or ""]
    parts.append(f"{status.get('phase', '?'):<10}")
    parts.append(f"round {status.get('round', 0):<3} world {status.get('worldSize', 0):<2}")
    parts.append(f"replicas {status.get('replicasText', '-'):<5} restarts {status.get('restartsText', '-'):<5}")
    if "step" in progress:
        parts.append(f"step {progress['step']:<5} loss {progress.get('loss', float('nan')):.4f}")
    if status.get("phase") in ("Restarting", "Succeeded", "Failed"):
        parts.append(f"({status.get('reason')}: {status.get('message')})")
    return " ".join(p for p in parts if p)
