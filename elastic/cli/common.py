"""What several verbs share: the etcd option, connecting, printing status lines."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from elastic.cli.live_state import LiveState, of_status
from elastic.cli.live_view import status_line
from elastic.cli.local_etcd import how_to_start, read_endpoint
from elastic.cluster.local import MAX_PROCESSES_ENV, PROCESSES_PER_CPU, default_max_processes
from elastic.errors import PermanentError
from elastic.policy.spec_warnings import spec_warnings
from elastic.spec import ElasticJob
from elastic.spec.model import INT32_MAX
from elastic.store import EtcdAuth, Store
from elastic.store.auth import ENV_VARS, FLAGS

ETCD_ENV = "ELASTIC_ETCD"


def say(line: str) -> None:
    """A line for the person at the terminal that is not the command's output (an etcd outage's start and
    end): on stderr, at once, so that it shows above a live view."""
    print(line, file=sys.stderr, flush=True)


def add_etcd_option(parser: argparse.ArgumentParser, starts_one: bool = False) -> None:
    """`--etcd`: default $ELASTIC_ETCD, else this machine's local etcd (cli/local_etcd.py), looked up when the
    command connects (not when the parser is built: `--help` and `--version` read no file). `starts_one`:
    the command (`run`) starts the local etcd when none runs, instead of saying how to."""
    fallback = "the local etcd, started if none runs" if starts_one else "the local etcd ('elastic etcd status')"
    parser.add_argument(
        "--etcd",
        default=os.environ.get(ETCD_ENV),
        metavar="URL",
        help=f"etcd endpoint(s), e.g. http://127.0.0.1:2379[,http://h2:2379] (default: ${ETCD_ENV}, else "
        f"{fallback})",
    )

    group = parser.add_argument_group("etcd TLS and auth (each defaults to its $ELASTIC_ETCD_* variable)")
    for name, flag in FLAGS.items():
        note = "; prefer the variable: a command line is visible to every local user" if name == "password" else ""
        group.add_argument(flag, dest=f"etcd_{name}", default=None, help=f"default: ${ENV_VARS[name]}{note}")


def add_no_tty_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-tty", action="store_true",
                        help="plain lines, one per change, even on a terminal (as when output goes to a file)")


def whole_number(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number in [low, high], else one usage line naming the range (a port of
    99999 or a signal of 1000 would otherwise fail later, as a traceback from the OS)."""

    def parse(text: str) -> int:
        if not text.strip().isdigit() or not low <= int(text) <= high:
            raise argparse.ArgumentTypeError(f"{text[:20]!r} is not a whole number from {low} to {high}")
        return int(text)

    return parse


def add_process_cap_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-local-processes",
        dest="process_cap",
        type=whole_number(1, INT32_MAX),
        default=os.environ.get(MAX_PROCESSES_ENV) or None,
        metavar="N",
        help=f"most training processes (workers x nprocPerNode) run on this machine; a job that needs more "
        f"fails with a clear message (default: ${MAX_PROCESSES_ENV}, else {PROCESSES_PER_CPU} per CPU, "
        f"here {default_max_processes()})",
    )


def process_cap(args: argparse.Namespace) -> int:
    return args.process_cap if args.process_cap is not None else default_max_processes()


def print_spec_warnings(job: ElasticJob, source: object, local: bool = False) -> None:
    """Warnings are not errors: one `warning:` line each on stderr, and the command carries on. `local`: the
    job is about to run as local worker processes (run, submit)."""
    for line in spec_warnings(job, local):
        print(f"warning: {source}: {line}", file=sys.stderr)


def etcd_auth(args: argparse.Namespace) -> EtcdAuth:
    """TLS/auth settings of a command: its flags, else the ELASTIC_ETCD_* environment."""
    return EtcdAuth.from_env().override(**{name: getattr(args, f"etcd_{name}", None) for name in FLAGS})


def resolve_etcd(args: argparse.Namespace) -> str:
    """The command's etcd: `--etcd` (or $ELASTIC_ETCD), else the local etcd that runs, else one line saying how
    to start one. Kept in `args.etcd`, so that messages name the etcd the command used."""
    if args.etcd is None:
        args.etcd = read_endpoint()
        if args.etcd is None:
            raise PermanentError(how_to_start())
    return str(args.etcd)


def connect(args: argparse.Namespace, endpoints: str | None = None) -> Store:
    """The store of a command: `endpoints`, else its etcd (resolve_etcd), with its TLS/auth settings."""
    return Store(endpoints or resolve_etcd(args), retry_seconds=5, timeout=2, auth=etcd_auth(args))


class StatusPrinter:
    """One line per visible change of a job's status (`elastic controller`, polling every job it runs)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.last: LiveState | None = None

    def __call__(self, status: dict[str, Any], job: str | None = None) -> None:
        state = of_status(status)
        if not state.changed_from(self.last):
            return
        self.last = state
        print(status_line(state, time.monotonic() - self.started, job), flush=True)


def format_status_line(status: dict[str, Any], elapsed: float | None = None, job: str | None = None) -> str:
    return status_line(of_status(status), elapsed, job)
