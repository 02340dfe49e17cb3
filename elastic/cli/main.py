"""`elastic`: the command line. Each verb lives in its own module; this one only dispatches.

Errors this project raises on purpose print as one line on stderr (exit 1), never as a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from elastic.cli import chaos_cmd, etcd_cmd, jobs_cmd, run_cmd
from elastic.errors import ElasticError

VERBS = [run_cmd, jobs_cmd, chaos_cmd, etcd_cmd]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="elastic",
        description="Elastic PyTorch training on etcd v3.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail to stderr")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb in VERBS:
        verb.register(verbs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
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


if __name__ == "__main__":
    sys.exit(main())
