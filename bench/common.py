"""What the three benchmarks share: statistics, etcd request counting, tables, CSV/PNG output, RESULT lines.

Nothing here decides what is measured; `recovery.py`, `scale.py` and `overhead.py` do.
"""

from __future__ import annotations

import contextlib
import csv
import datetime
import importlib.metadata
import importlib.util
import math
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastic.spec import defaults

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
TORCHRUN = (PYTHON, "-m", "torch.distributed.run")

# The backends' own defaults, as documented by their code (what "defaults" means in every table).
ETCD_V3_DEFAULTS = (
    f"lease_seconds={defaults.LEASE_SECONDS}, last_call_seconds={defaults.LAST_CALL_SECONDS:g} "
    f"(settle_seconds={defaults.SETTLE_SECONDS:g})"
)
C10D_DEFAULTS = "last_call_timeout=30, keep_alive_interval=5 x keep_alive_max_attempt=3"
EQUAL_LAST_CALL_SECONDS = 2


# --- statistics ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """Median and range of one metric for one variant; `n` values, `failed` runs that gave none."""

    values: tuple[float, ...]
    failed: int = 0

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Summary:
        values = list(values)
        got = [v for v in values if v is not None and not math.isnan(v)]
        return cls(tuple(got), len(values) - len(got))

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else math.nan

    @property
    def min(self) -> float:
        return min(self.values) if self.values else math.nan

    @property
    def max(self) -> float:
        return max(self.values) if self.values else math.nan

    def text(self, digits: int = 1) -> str:
        """`12.3 [11.0-14.2] n=3` (and `+1 failed` when runs gave no value)."""
        if not self.values:
            return f"none ({self.failed} failed)" if self.failed else "—"
        body = f"{self.median:.{digits}f}"
        if self.n > 1:
            body += f" [{self.min:.{digits}f}-{self.max:.{digits}f}]"
        body += f" n={self.n}"
        if self.failed:
            body += f" +{self.failed} failed"
        return body


def ratio(numerator: float, denominator: float) -> float:
    if math.isnan(numerator) or math.isnan(denominator) or denominator == 0:
        return math.nan
    return numerator / denominator


def number(value: float, digits: int = 3) -> str:
    """A RESULT value: plain decimal, `nan` when there is none."""
    if value is None or math.isnan(value):
        return "nan"
    return f"{value:.{digits}f}"


def result_line(metric: str, etcd_v3: float, c10d: float, inverted: bool = False) -> str:
    """`RESULT <metric> etcd-v3=<v> c10d=<v> ratio=<c10d/etcd-v3>`; `inverted` (steps/s): etcd-v3/c10d.

    Either way a ratio above 1 means etcd-v3 is better.
    """
    r = ratio(etcd_v3, c10d) if inverted else ratio(c10d, etcd_v3)
    return f"RESULT {metric} etcd-v3={number(etcd_v3)} c10d={number(c10d)} ratio={number(r, 2)}"


# --- tables and files ---------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-markdown table, readable as plain text too."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def write_csv(path: Path, rows: Sequence[dict[str, object]]) -> None:
    if not rows:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fields: list[str] = []
    for row in rows:
        fields += [k for k in row if k not in fields]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def bar_chart(path: Path, title: str, ylabel: str, groups: dict[str, dict[str, Summary]], log: bool = False) -> str:
    """One group of bars (median, min-max whiskers) per metric; returns a note of what was written."""
    if importlib.util.find_spec("matplotlib") is None:
        return f"chart {path.name} not written: matplotlib is not installed (pip install matplotlib)"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants: list[str] = []
    for by_variant in groups.values():
        variants += [v for v in by_variant if v not in variants]
    width = 0.8 / max(len(variants), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(groups) + 2), 4.2))
    for i, variant in enumerate(variants):
        xs, ys, lo, hi = [], [], [], []
        for g, by_variant in enumerate(groups.values()):
            s = by_variant.get(variant)
            if s is None or not s.values:
                continue
            xs.append(g + (i - (len(variants) - 1) / 2) * width)
            ys.append(s.median)
            lo.append(s.median - s.min)
            hi.append(s.max - s.median)
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=variant)
    ax.set_xticks(range(len(groups)), list(groups), rotation=0, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"chart written: {path}"


# --- the machine --------------------------------------------------------------------------------


def environment(etcd_binary: Path | None = None) -> dict[str, str]:
    """Date, machine, versions: the header of every results table. torch's version is read from its package
    metadata, not by importing it: the controller benchmarks measure their own process's memory."""
    from elastic.store.server import etcd_version, find_etcd_binary

    binary = etcd_binary or find_etcd_binary()
    load = os.getloadavg()
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
        "load_at_start": f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        "python": platform.python_version(),
        "torch": importlib.metadata.version("torch"),
        "etcd": f"{etcd_version(binary)} ({binary})",
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
    }


def print_environment(env: dict[str, str]) -> None:
    for key, value in env.items():
        print(f"# {key}: {value}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- etcd requests ------------------------------------------------------------------------------

_SAMPLE = re.compile(r'^(\w+)\{([^}]*)\}\s+([0-9.eE+-]+)$|^(\w+)\s+([0-9.eE+-]+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')


class EtcdMetrics:
    """Request and byte counters from etcd's `/metrics` endpoint (its own counters: nothing is estimated).

    `requests` are gRPC messages etcd received from clients (`grpc_server_msg_received_total`): one per
    unary call (Range, Put, Txn, LeaseGrant, ...) and one per message on a stream (each lease keep-alive,
    each watch create/cancel). `bytes_sent` is everything etcd sent to clients: what the members read;
    `events_sent` the watch events it delivered (one per watcher a change concerns).
    """

    def __init__(self, client_url: str) -> None:
        self.url = client_url.rstrip("/") + "/metrics"

    def sample(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url, timeout=10) as response:
            text = response.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            m = _SAMPLE.match(line)
            if m is None:
                continue
            if m.group(4):
                if m.group(4) == "etcd_network_client_grpc_sent_bytes_total":
                    out["bytes_sent"] = float(m.group(5))
                elif m.group(4) == "etcd_network_client_grpc_received_bytes_total":
                    out["bytes_received"] = float(m.group(5))
                elif m.group(4) == "etcd_debugging_mvcc_events_total":  # watch events sent to watchers
                    out["events_sent"] = float(m.group(5))
                continue
            name, labels, value = m.group(1), dict(_LABEL.findall(m.group(2))), float(m.group(3))
            if name == "grpc_server_msg_received_total" and labels.get("grpc_service", "").startswith("etcdserverpb"):
                key = f"requests:{labels['grpc_method']}"
                out[key] = out.get(key, 0.0) + value
        return out

    @staticmethod
    def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in set(before) | set(after)}

    @staticmethod
    def requests(delta: dict[str, float]) -> float:
        return sum(v for k, v in delta.items() if k.startswith("requests:"))

    @staticmethod
    def by_method(delta: dict[str, float]) -> dict[str, float]:
        return {k.split(":", 1)[1]: v for k, v in sorted(delta.items()) if k.startswith("requests:") and v}


def etcd_round_trip_seconds(client_url: str, samples: int = 30) -> float:
    """Median latency of one etcd read from this machine (the 'one round trip' of the floor)."""
    from elastic.store import Store

    with Store(client_url) as store:
        store.get("/bench/rtt")  # connect first
        times = []
        for _ in range(samples):
            t = time.perf_counter()
            store.get("/bench/rtt")
            times.append(time.perf_counter() - t)
    return statistics.median(times)


# --- etcd-v2 (torch's own etcd backend), only where it can run -----------------------------------


def etcd_v2_skip_reason() -> str | None:
    """None when torch's `etcd-v2` backend can be measured here; else the one-line reason why not."""
    if importlib.util.find_spec("etcd") is None:
        return ("etcd-v2 skipped: torch's etcd-v2 backend needs the `python-etcd` package (v2 API client), "
                "which is not importable here")
    binary = shutil.which("etcd")
    if binary is None:
        return "etcd-v2 skipped: no etcd binary on PATH to start with --enable-v2"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
        if "--enable-v2" in out.stdout + out.stderr:
            return None
    return f"etcd-v2 skipped: {binary} has no --enable-v2 (etcd 3.6 removed the v2 API)"


def etcd_v2_server():  # pragma: no cover - only where python-etcd exists
    """A managed etcd with the v2 API on, for torch's `etcd-v2` backend."""
    from elastic.store.server import EtcdServer

    class EtcdV2Server(EtcdServer):
        def command(self) -> list[str]:
            return [*super().command(), "--enable-v2=true"]

    return EtcdV2Server(binary=Path(shutil.which("etcd") or "etcd"))


def etcd_server():
    """The managed local etcd (elastic.store.server.EtcdServer): stock server flags."""
    from elastic.store.server import EtcdServer

    return EtcdServer()


def log(message: str) -> None:
    """Progress on stderr, so that stdout stays the report."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Measurement:
    """One measured incident: seconds from the fault to training again (None: never), whether it was clean."""

    scenario: str
    variant: str
    repeat: int
    value: float | None
    clean: bool | None = None
    note: str = ""


@dataclass(frozen=True)
class Variant:
    """One backend with one set of settings, as a column of a benchmark table."""

    name: str
    backend: str
    conf: dict[str, object]
    description: str


def exit_cleanly_on_sigterm() -> None:
    """`kill` (SIGTERM) unwinds like Ctrl-C: the managed etcd and the temporary directories are removed."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def flattened(row: Any, nested: str, prefix: str = "req_") -> dict[str, Any]:
    """A dataclass row as one CSV line: its dict field `nested` spread into `prefix`-named columns."""
    data = dict(row.__dict__)
    spread = data.pop(nested)
    return data | {f"{prefix}{k}": v for k, v in spread.items()}
