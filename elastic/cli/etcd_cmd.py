"""`elastic etcd`: run the managed local etcd in the foreground until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from elastic.cli.common import whole_number
from elastic.cli.endpoint_file import remove_endpoint, write_endpoint
from elastic.store.server import EtcdServer


def register(verbs: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser(
        "etcd",
        help="run a local etcd (v3 API only) in the foreground",
        description="Start a single-member etcd on loopback, print its client URL, stop it on Ctrl-C. While it "
        "runs, commands on this machine default to it when neither --etcd nor $ELASTIC_ETCD is given.",
    )
    parser.add_argument("--port", type=whole_number(1, 65535), default=None, help="client port (default: a free one)")
    parser.add_argument("--data-dir", type=Path, default=None, help="data directory (default: a temporary one)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    server = EtcdServer(data_dir=args.data_dir, client_port=args.port)
    server.start()
    try:
        print(f"etcd {server.version} serving at {server.client_url} (data: {server.data_dir})", flush=True)
        print(f"ELASTIC_ETCD={server.client_url}", flush=True)
        print(f"address written to {write_endpoint(server.client_url)}: other commands here default to it",
              flush=True)
        stop.wait()
    finally:
        remove_endpoint(server.client_url)
        server.remove()
    print("etcd stopped", flush=True)
    return 0
