"""A command run under a pseudo-terminal, as an operator's shell runs it: isatty() is true, so the live
view draws; everything it writes is read as it comes (a full pty would block the command)."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

from cli_harness import REPO

COLUMNS, ROWS = 140, 50


class Terminal:
    def __init__(self, args: list[str], cwd: Path = REPO) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "elastic.cli.main", *args], cwd=cwd, stdin=slave, stdout=slave, stderr=slave,
            env={**os.environ, "TERM": "xterm-256color", "OMP_NUM_THREADS": "1", "COLUMNS": str(COLUMNS),
                 "LINES": str(ROWS)}, start_new_session=True,
        )  # fmt: skip
        os.close(slave)
        self._master = master
        self._chunks: list[bytes] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._master, 65536)
            except OSError:  # EIO: the command closed the terminal (it exited)
                break
            if not data:
                break
            with self._lock:
                self._chunks.append(data)
        os.close(self._master)

    def text(self) -> str:
        with self._lock:
            return b"".join(self._chunks).decode("utf-8", "replace")

    def wait(self, timeout: float) -> int:
        """The exit status, once everything the command wrote has been read."""
        code = self.process.wait(timeout)
        self._reader.join(10)
        return code

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
