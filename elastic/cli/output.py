"""stdout closed under a command (`elastic status | head -1`, `elastic run JOB.yaml | head -2`)."""

from __future__ import annotations

import os
import signal
import sys

OUTPUT_CLOSED_EXIT = 128 + signal.SIGPIPE  # what a shell reports for a writer ended by a closed pipe


def discard_stdout() -> None:
    """stdout was closed: whatever is printed from now on goes nowhere, instead of failing again (and at exit,
    when Python flushes it, with a traceback)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
