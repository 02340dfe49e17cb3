"""`elastic`: the command line. Each verb lives in its own module; this one only dispatches.

Errors this project raises on purpose print as one line on stderr (exit 1), never as a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from elastic.cli import agent_cmd, completion_cmd
from elastic.cli.output import OUTPUT_CLOSED_EXIT, discard_stdout
from elastic.errors import ElasticError

# The module of each verb, in the order `--help` lists them. Only the module of the verb asked for is
# imported (each imports what its verb runs: the etcd client, the spec model, rich), so a command starts
# in a fraction of a second; `--help`, a mistyped verb and completion build them all.
VERBS: dict[str, tuple[str, ...]] = {
    "run_cmd": ("run", "controller"),
    "jobs_cmd": ("validate", "submit", "scale", "delete"),
    "status_cmd": ("status",),
    "describe_cmd": ("describe",),
    "logs_cmd": ("logs",),
    "chaos_cmd": ("chaos",),
    "etcd_cmd": ("etcd",),
    "agent_cmd": ("agent",),
}
GLOBAL_FLAGS = ("-v", "--verbose")
NO_VERB = "--version"  # answered before any verb is needed: no verb module is imported


def package_version() -> str:
    try:
        return version("elastic-etcd")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The command line: every verb, or only `verb` (NO_VERB: none)."""
    parser = argparse.ArgumentParser(
        prog="elastic",
        description="Elastic PyTorch training on etcd v3.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail to stderr")
    parser.add_argument("--version", action="version", version=f"elastic {package_version()}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    known = {name for names in VERBS.values() for name in names} | {"completion"}
    wanted = verb if verb in known or verb == NO_VERB else None
    for module, names in VERBS.items():
        if wanted is None or wanted in names:
            importlib.import_module(f"elastic.cli.{module}").register(verbs)
    if wanted in (None, "completion"):
        completion_cmd.register(verbs, build_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    first = next((i for i, word in enumerate(argv) if word not in GLOBAL_FLAGS), len(argv))
    if argv[first : first + 1] == ["agent"]:  # torchrun's arguments, untouched by argparse
        return agent_cmd.run_agent(argv[first + 1 :])
    args = build_parser(argv[first] if first < len(argv) else None).parse_args(argv)
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
