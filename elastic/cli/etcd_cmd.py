"""`elastic etcd [start|stop|status]`: this user's local etcd (cli/local_etcd.py), in the foreground until
Ctrl-C, or in the background where `elastic run` leaves it."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from elastic.cli.common import whole_number
from elastic.cli.local_etcd import default_data_dir, endpoint_file, remove_endpoint, running, start, stop
from elastic.errors import PermanentError

ACTIONS = ("start", "stop", "status")


def register(verbs: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser(
        "etcd",
        help="this machine's local etcd (v3 API only): in the foreground, or start|stop|status in the background",
        description="With no action: start a single-member etcd on loopback in the foreground, print its client "
        "URL, stop it on Ctrl-C. 'start': the same in the background (as 'elastic run' starts it when none "
        "runs); 'stop': stop the one that runs; 'status': where it serves, or that none runs. While it runs, "
        "commands on this machine default to it when neither --etcd nor $ELASTIC_ETCD is given. Its data "
        f"(default {default_data_dir()}) is kept when it stops and reused by the next start.",
    )
    parser.add_argument("action", nargs="?", choices=ACTIONS, help="start, stop or status (none: foreground)")
    parser.add_argument("--port", type=whole_number(1, 65535), default=None, help="client port (default: a free one)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help=f"data directory (default: {default_data_dir()}, kept between starts)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.action == "status":
        return show_status()
    if args.action == "stop":
        stopped = stop()
        print(f"etcd at {stopped.url} stopped (data kept in {stopped.data_dir})" if stopped else
              "no local etcd runs: nothing to stop")  # fmt: skip
        return 0
    if args.action == "start":
        found, server = start(args.data_dir, args.port)
        print(f"etcd {server.version} started at {found.url} (data: {found.data_dir}; 'elastic etcd stop' "
              "stops it)" if server else f"etcd already runs at {found.url} (data: {found.data_dir})")  # fmt: skip
        return 0
    return foreground(args.data_dir, args.port)


def show_status() -> int:
    """`elastic etcd status`: exit 0 when a local etcd runs, 1 otherwise (usable in scripts)."""
    found = running()
    if found is None:
        print(f"no local etcd runs (none recorded in {endpoint_file()}): 'elastic etcd start' starts one",
              file=sys.stderr)
        return 1
    print(f"etcd serving at {found.url} (pid {found.pid}, data: {found.data_dir})")
    return 0


def foreground(data_dir: Path | None, port: int | None) -> int:
    """Serve until SIGINT or SIGTERM, or until the server itself ends (`elastic etcd stop` from elsewhere)."""
    stopped = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopped.set())
    found, server = start(data_dir, port)
    if server is None:
        raise PermanentError(f"a local etcd already runs at {found.url} (pid {found.pid}, data: {found.data_dir}): "
                             "use it, or stop it first with 'elastic etcd stop'")
    assert server.process is not None
    process = server.process
    threading.Thread(target=lambda: (process.wait(), stopped.set()), name="etcd exit", daemon=True).start()
    try:
        print(f"etcd {server.version} serving at {found.url} (data: {found.data_dir})", flush=True)
        print(f"ELASTIC_ETCD={found.url}", flush=True)
        print(f"address written to {endpoint_file()}: other commands here default to it", flush=True)
        stopped.wait()
    finally:
        remove_endpoint(found.url)
        server.stop()
    print("etcd stopped", flush=True)
    return 0
