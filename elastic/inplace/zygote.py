"""Warm worker starts: workers are forks of a server that has already imported torch.

A cold worker start is a Python start plus `import torch` (2-3 s on a small CPU), which is most of what a
restart costs once the rendezvous itself is fast. The standard library's forkserver is exactly the zygote
this needs: a clean process (exec'd, never forked from the agent, so none of the agent's gRPC threads or
sockets), which imports the preload modules once and then forks one child per worker. Nothing runs a
torch op or starts a thread in it before a fork, so every child starts as if it had imported torch itself.

A child's parent is the forkserver, not the agent; the forkserver exits when the agent does, and each
child asks the kernel to kill it then (PR_SET_PDEATHSIG), so a SIGKILLed agent takes its workers along as a
torchrun agent's process group would.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import multiprocessing.forkserver
import os
import runpy
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess

# Imported once in the forkserver; each is a module a worker would import anyway (torch._dynamo: the first
# optimizer a script builds imports it, 0.8 s on a small CPU, unless a replacement inherits it).
PRELOAD = ("torch", "torch.distributed", "torch.nn", "torch.optim", "torch._dynamo", "elastic.train")
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class WorkerCommand:
    """What torchrun would exec: a script (or `-m module`) with its arguments, in an environment."""

    entry: str
    args: tuple[str, ...] = ()
    module: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None


class Zygote:
    """Starts workers as forks of one warm forkserver (one per agent process)."""

    def __init__(self, preload: Sequence[str] = PRELOAD) -> None:
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(list(preload))

    def warm(self) -> None:
        """Start the forkserver now (it imports the preload modules), so the first worker start is a fork."""
        multiprocessing.forkserver.ensure_running()

    def start(self, command: WorkerCommand, name: str) -> BaseProcess:
        process = self._context.Process(target=run_worker, args=(command,), name=name, daemon=False)
        process.start()
        return process


def run_worker(command: WorkerCommand) -> None:
    """The child's body: become the worker process torchrun would have started (its exit code included)."""
    _die_with_parent()
    os.environ.update(command.env)
    if command.cwd:
        os.chdir(command.cwd)
    sys.argv = [command.entry, *command.args]
    if command.module:
        runpy.run_module(command.entry, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(command.entry)))
        runpy.run_path(command.entry, run_name="__main__")
    sys.stdout.flush()
    sys.stderr.flush()


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the forkserver's exit is the only link
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before the call above
        os._exit(1)
