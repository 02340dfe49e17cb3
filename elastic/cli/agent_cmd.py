"""`elastic agent ARGS`: torchrun with the etcd-v3 backend as default (the same as `elastic-agent`).

Every argument after `agent` is torchrun's, so `main` hands them over untouched (argparse would take
torchrun's options for its own); `elastic agent --help` is torchrun's help.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def register(verbs: argparse._SubParsersAction) -> None:
    agent = verbs.add_parser(
        "agent",
        help="torchrun with the etcd-v3 backend and job-level budget defaults (torchrun's arguments)",
        add_help=False,
    )
    agent.add_argument("torchrun_args", nargs=argparse.REMAINDER, metavar="TORCHRUN_ARGS")
    agent.set_defaults(run=lambda args: run_agent(args.torchrun_args))


def run_agent(argv: Sequence[str]) -> int:
    from elastic.agent import main  # imports torch: only when an agent is asked for

    main(list(argv))
    return 0
