"""Warm worker starts: workers are forks of a server that has already imported torch.

A cold worker start is a Python start plus `import torch` (2-3 s on a small CPU), which is most of what a
restart costs once the rendezvous itself is fast. The standard library's forkserver is exactly the zygote
this needs: a clean process (exec'd, never forked from the agent, so none of the agent's gRPC threads or
sockets), which imports the preload modules once and then forks one child per worker. Nothing runs a
torch op or starts a thread in it before a fork, so every child starts as if it had imported torch itself.

A child's parent is the forkserver, not the agent; the forkserver exits when the agent does, and each
child asks the kernel to kill it then (PR_SET_PDEATHSIG), so a SIGKILLed agent takes its workers along as a
torchrun agent's process group would.

A fork of the forkserver is a multiprocessing child in the middle of its bootstrap, which a script must
not notice (issue 28): before the script runs, the child leaves multiprocessing (its default context is the
platform's again, not the forkserver, whose new servers re-run an unguarded main module and failed every
DataLoader worker; its processes are its own children; it shares neither the agent's resource tracker nor
the zygote's liveness pipe), draws a fresh torch seed (siblings would share the zygote's), and the script
then runs as `python script.py` (or `python -m module`) runs it: in the `__main__` module, with the
interpreter's `sys.argv` and `sys.path[0]`, and it ends as Python ends a program (the exit code of
`SystemExit`, or 1 after the traceback of an uncaught exception; non-daemon threads joined, `atexit`
handlers run), never through multiprocessing's child epilogue.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import importlib.machinery
import io
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import multiprocessing.process
import multiprocessing.resource_tracker
import os
import runpy
import signal
import sys
import threading
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess

from elastic.cluster.processes import die_with_parent

# Imported once in the forkserver; each is a module a worker would import anyway (torch._dynamo: the first
# optimizer a script builds imports it, 0.8 s on a small CPU, unless a replacement inherits it).
# This module too: a worker takes the zygote's own main-process object from it (see MAIN_PROCESS).
PRELOAD = ("torch", "torch.distributed", "torch.nn", "torch.optim", "torch._dynamo", "elastic.train", __name__)
# What `multiprocessing.current_process()` is in a program's main process (multiprocessing deletes the name
# of its class); taken where this module is imported: the agent, and the zygote before it forks a worker.
MAIN_PROCESS = multiprocessing.process.current_process()


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

    def start_server(self) -> None:
        """Start the forkserver now; it imports the preload modules while this process goes on."""
        multiprocessing.forkserver.ensure_running()

    def warm(self) -> None:
        """Return once the forkserver has imported the preload modules: an agent joins a round only when it
        can start its workers at once. A newcomer that joined cold made the whole job wait in the new round's
        process group for its zygote's `import torch` (scale-up: 2.1 s of survivors' time, 2 agents)."""
        self.start_server()
        probe = self._context.Process(target=_ready, name="zygote-ready", daemon=True)
        probe.start()  # the forkserver forks (so answers) only once its preload is done
        probe.join()

    def start(self, command: WorkerCommand, name: str) -> BaseProcess:
        process = self._context.Process(target=run_worker, args=(command,), name=name, daemon=False)
        process.start()
        return process


def _ready() -> None:
    """The readiness probe's body: nothing (its fork was the answer)."""


def run_worker(command: WorkerCommand) -> None:
    """The child's body: become the worker process torchrun would have started, its exit code included (it
    never returns: multiprocessing's child epilogue would skip `atexit` and report errors as its own)."""
    die_with_parent()
    _leave_multiprocessing()
    _reseed()
    _unbuffer_output()
    os.environ.update(command.env)
    if command.cwd:
        os.chdir(command.cwd)
    _end(_run_main(command))


def _leave_multiprocessing() -> None:
    """Make this process a program's main process again, as far as multiprocessing can tell (see above)."""
    server, tracker = multiprocessing.forkserver._forkserver, multiprocessing.resource_tracker._resource_tracker
    parent = multiprocessing.process.parent_process()
    inherited = [server._forkserver_alive_fd, tracker._fd, *(server._inherited_fds or ()),
                 parent.sentinel if parent is not None else None]
    for fd in inherited:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
    server.__init__()  # type: ignore[misc]  # back to "no server yet": the script's first use starts its own
    tracker.__init__()  # type: ignore[misc]
    assert type(MAIN_PROCESS).__name__ == "_MainProcess", "elastic.inplace.zygote imported in a child process"
    MAIN_PROCESS.name = "MainProcess"  # the child's preparation gave it the worker's name and the agent's key
    MAIN_PROCESS.authkey = os.urandom(32)
    multiprocessing.process._current_process = MAIN_PROCESS
    multiprocessing.process._parent_process = None
    multiprocessing.context._default_context._actual_context = None  # the platform's default, on first use
    sys.modules.pop("__mp_main__", None)  # the agent's main module, imported as the child was prepared


def _reseed() -> None:
    """A fresh torch seed, as a fresh `import torch` draws (Python's `random` reseeds itself after a fork)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()


def _unbuffer_output() -> None:
    """stdout and stderr as `python -u` opens them (torchrun runs its workers with -u): every write reaches
    the log at once, also from a worker that is killed; the zygote's were opened by its own flags."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or stream.write_through:
            continue
        stream.flush()
        raw = io.FileIO(stream.fileno(), "w", closefd=False)
        unbuffered = io.TextIOWrapper(raw, encoding=stream.encoding, errors=stream.errors, write_through=True)
        setattr(sys, name, unbuffered)
        setattr(sys, f"__{name}__", unbuffered)  # the zygote's own is dropped (it never closes the fd)


def _run_main(command: WorkerCommand) -> int | None:
    """Run the script as the interpreter runs its command line; the exit code Python would end with (None:
    an uncaught KeyboardInterrupt, which the interpreter ends with by SIGINT)."""
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    sys.argv = [command.entry, *command.args]
    if not getattr(sys.flags, "safe_path", False):  # -P / PYTHONSAFEPATH (3.11+): nothing is prepended
        sys.path[0] = os.getcwd() if command.module else os.path.dirname(os.path.realpath(command.entry))
    try:
        if command.module:
            runpy._run_module_as_main(command.entry)  # type: ignore[attr-defined]  # what `python -m` runs
        else:
            _run_script(main, command.entry)
        return 0
    except SystemExit as exit_:
        return _exit_code(exit_)
    except BaseException as err:  # as the interpreter: the traceback (from the script's frames), then 1
        tb = err.__traceback__
        while tb is not None and tb.tb_frame.f_globals.get("__name__") in (__name__, "runpy"):
            tb = tb.tb_next
        sys.excepthook(type(err), err, tb)
        return None if isinstance(err, KeyboardInterrupt) else 1


def _run_script(main: types.ModuleType, path: str) -> None:
    """`python path`: the code runs in the `__main__` module itself (runpy.run_path would run it in a
    temporary module, taken out of `sys.modules` again before the `atexit` handlers run)."""
    main.__file__ = os.path.abspath(path)
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", main.__file__)
    main.__spec__ = main.__package__ = None
    main.__cached__ = None  # type: ignore[attr-defined]
    with io.open_code(main.__file__) as source:
        code = compile(source.read(), main.__file__, "exec")
    exec(code, main.__dict__)


def _exit_code(exit_: SystemExit) -> int:
    if exit_.code is None:
        return 0
    if isinstance(exit_.code, int):
        return exit_.code
    print(exit_.code, file=sys.stderr)
    return 1


def _end(code: int | None) -> None:
    """Python's own end of a program: non-daemon threads joined (and `concurrent.futures`' exit hooks run:
    that is `threading._shutdown`), then the `atexit` handlers, then the streams flushed; None (an uncaught
    KeyboardInterrupt) ends by SIGINT, as the interpreter does."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if code is None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(1 if code is None else code)

