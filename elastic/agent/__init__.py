"""`elastic agent` (`python -m elastic.agent`): torchrun with the etcd-v3 backend as default and each
worker's failure reported to it; `--recovery=in-place` runs the in-place agent instead (see `launcher`).

This module imports no torch, on purpose: an in-place agent's workers are forks of a zygote that imports
torch itself (`elastic.inplace.zygote`), and starting that zygote here, before the launcher's own `import
torch`, lets the two imports run side by side. An agent that joins a job (a scale-up, a returned node, a
spare) is then ready to fork its workers about one torch import after its start instead of two.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

RECOVERY_FLAG = "--recovery"


def main(argv: Sequence[str] | None = None) -> None:
    recovery, args = split_recovery(sys.argv[1:] if argv is None else argv)
    if recovery == "in-place":
        from elastic.inplace.zygote import Zygote

        Zygote().start_server()
    from elastic.agent.launcher import launch

    launch(recovery, args)


def split_recovery(argv: Sequence[str]) -> tuple[str, list[str]]:
    """`--recovery=in-place` (or `--recovery in-place`) taken out of torchrun's arguments; default restart."""
    args, mode, skip = [], "restart", False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg == RECOVERY_FLAG and i + 1 < len(argv):
            mode, skip = argv[i + 1], True
        elif arg.startswith(RECOVERY_FLAG + "="):
            mode = arg.split("=", 1)[1]
        else:
            args.append(arg)
    if mode not in ("restart", "in-place"):
        raise SystemExit(f"elastic agent: --recovery={mode}: expected restart or in-place")
    return mode, args
