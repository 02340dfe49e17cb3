"""What a script knows of itself and its process: its identity (`__name__`, `__file__`, `sys.argv`,
`sys.path[0]`, the working directory, torchrun's variables, its pid and parent), its own handling of the
process (signal handlers, `atexit`, `logging`, `faulthandler`, a non-daemon thread), random state not shared
with its siblings, and torch's `@record` writing the error file torchrun names. Rank 1 raises once.

Run as a path and as `python -m compatpkg.identity`; `corpus` comes from PYTHONPATH in both."""

from __future__ import annotations

import argparse
import atexit
import faulthandler
import json
import logging
import multiprocessing
import os
import random
import signal
import sys
import tempfile
import threading
from pathlib import Path

import corpus
import torch
from torch.distributed.elastic.multiprocessing.errors import record

TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                      "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_MAX_RESTARTS")


def identity(args: argparse.Namespace) -> None:
    rank = os.environ["RANK"]
    corpus.emit("name", __name__)
    corpus.emit("spec", __spec__.name if __spec__ else None)
    corpus.emit("file", __file__)
    corpus.emit("argv", sys.argv)
    corpus.emit("path0", os.path.relpath(sys.path[0]))
    corpus.emit(f"env.rank{rank}", " ".join(f"{k}={os.environ[k]}" for k in TORCHRUN_VARIABLES))
    corpus.emit("run_id", os.environ["TORCHELASTIC_RUN_ID"] == os.environ["COMPAT_RUN_ID"])
    corpus.emit("restart_count", os.environ["TORCHELASTIC_RESTART_COUNT"].isdigit())
    corpus.emit("master", bool(os.environ["MASTER_ADDR"]) and int(os.environ["MASTER_PORT"]) > 0)
    corpus.emit("error_file", Path(os.environ["TORCHELASTIC_ERROR_FILE"]).parent.is_dir())
    parent = os.getppid()
    os.kill(parent, 0)  # the parent is alive: the launcher's process, not init
    corpus.emit("parent", parent not in (1, os.getpid()))
    corpus.emit("multiprocessing", (multiprocessing.current_process().name, multiprocessing.parent_process()))
    (args.out / f"identity.rank{rank}.txt").write_text("written relative to the working directory\n")
    per_process = args.out / "per-process"
    per_process.mkdir(exist_ok=True)
    (per_process / f"{os.getpid()}.json").write_text(json.dumps(
        {"random": random.random(), "torch": torch.rand(1).item(), "torch_seed": torch.initial_seed()}))


def process_handling(args: argparse.Namespace, finished: threading.Event) -> None:
    rank = os.environ["RANK"]
    corpus.emit("signals", [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)])
    for signum in (signal.SIGTERM, signal.SIGINT):
        handled = threading.Event()
        previous = signal.signal(signum, lambda *_, event=handled: event.set())
        os.kill(os.getpid(), signum)
        corpus.emit(f"handled.{signal.Signals(signum).name}", handled.wait(10))
        signal.signal(signum, previous)  # the launcher's own SIGTERM must still end this process
    corpus.emit("root_handlers", len(logging.getLogger().handlers))
    logging.basicConfig(format="log %(processName)s %(levelname)s %(message)s", level=logging.INFO)
    logging.info("configured by the script")
    corpus.emit("faulthandler", faulthandler.is_enabled())  # @record turned it on
    with tempfile.TemporaryFile("w+") as dump:
        faulthandler.dump_traceback(dump)
        dump.seek(0)
        corpus.emit("faulthandler_dump", "in process_handling" in dump.read())
    corpus.emit("unbuffered", sys.stdout.write_through)
    thread_file = args.out / f"thread.rank{rank}.txt"

    def late_thread() -> None:  # non-daemon: the interpreter joins it before the atexit handlers run
        finished.wait()
        thread_file.write_text("the script's thread finished\n")

    def at_exit() -> None:
        (args.out / f"atexit.rank{rank}.txt").write_text(f"thread joined first: {thread_file.exists()}\n")
        error_file = Path(os.environ["TORCHELASTIC_ERROR_FILE"])
        if error_file.exists():  # @record wrote it as the exception left main()
            message = json.loads(error_file.read_text())["message"]["message"]
            # Only the script's own error: under torchrun a survivor's collective also breaks (in place the
            # survivor carries on), which is the launchers' difference, not the script's.
            if "injected crash" in message:
                (args.out / f"error.rank{rank}.txt").write_text(message + "\n")

    threading.Thread(target=late_thread, name="late", daemon=False).start()
    atexit.register(at_exit)


@record
def main() -> None:
    args = corpus.parse_args()
    finished = threading.Event()
    identity(args)
    process_handling(args, finished)
    try:
        corpus.train(args, corpus.StepBatches(corpus.plain_loader(corpus.rank_dataset())), crash=corpus.raise_once)
    finally:
        finished.set()  # else the interpreter waits for the thread forever, in place as under torchrun


if __name__ == "__main__":
    main()
