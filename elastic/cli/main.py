"""`elastic`: the command line. Each verb lives in its own module; this one only dispatches.

Errors this project raises on purpose print as one line on stderr (exit 1), never as a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from elastic.cli import (
    agent_cmd,
    chaos_cmd,
    completion_cmd,
    describe_cmd,
    etcd_cmd,
    jobs_cmd,
    logs_cmd,
    run_cmd,
    status_cmd,
)
from elastic.cli.common import OUTPUT_CLOSED_EXIT, discard_stdout
from elastic.errors import ElasticError

VERBS = [run_cmd, jobs_cmd, status_cmd, describe_cmd, logs_cmd, chaos_cmd, etcd_cmd, agent_cmd]
GLOBAL_FLAGS = ("-v", "--verbose")


def package_version() -> str:
    try:
        return version("elastic-etcd")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="elastic",
        description="Elastic PyTorch training on etcd v3.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail to stderr")
    parser.add_argument("--version", action="version", version=f"elastic {package_version()}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb in VERBS:
        verb.register(verbs)
    completion_cmd.register(verbs, build_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    first = next((i for i, word in enumerate(argv) if word not in GLOBAL_FLAGS), len(argv))
    if argv[first : first + 1] == ["agent"]:  # torchrun's arguments, untouched by argparse
        return agent_cmd.run_agent(argv[first + 1 :])
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.run(args) or 0)
    except ElasticError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader is gone (`elastic status | head -1`): nobody to tell
        discard_stdout()
        return OUTPUT_CLOSED_EXIT


if __name__ == "__main__":
    sys.exit(main())
