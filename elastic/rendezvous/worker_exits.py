"""What `elastic agent` keeps of each worker's end: when it died, and the tail of its own error.

torch's agent notices a dead worker at its next monitor tick and stamps the failure in whole seconds, and
keeps no error text unless the script uses `@record`. Both are too little to tell which worker of an incident
failed first: a Python error in one worker and the broken all-reduce of its peer both exit 1, within the same
second (docs/design.md §3.16). So this agent
- watches each worker's pid (a pidfd, one blocked thread each): its death is timed to the millisecond;
- sends each worker's stderr to a file and copies it on to its own stderr as it grows (torch's `--tee`
  without the line prefix), so the tail of the error is there to read once the worker is dead; a user who
  chose `--redirects`/`--tee`/`--log-dir` keeps exactly that, and the files torch writes are read instead;
- prefers torch's error file (`@record`) where there is one: it holds the traceback itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import sys
import threading
import time
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, LogsSpecs, Std
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

ERROR_TAIL_BYTES = 16384  # read this much of a dead worker's stderr: its traceback is at the end
RELAY_INTERVAL = 0.05


class DeathWatch:
    """The wall-clock moment each watched process ended, seen by a thread blocked on its pidfd."""

    def __init__(self) -> None:
        self._deaths: dict[int, float] = {}

    def watch(self, pid: int) -> None:
        try:
            fd = os.pidfd_open(pid)
        except (OSError, AttributeError):  # gone already, or a kernel without pidfds: the monitor tick serves
            return
        threading.Thread(target=self._wait, args=(pid, fd), name=f"death-watch-{pid}", daemon=True).start()

    def _wait(self, pid: int, fd: int) -> None:
        try:
            select.select([fd], [], [])
            self._deaths[pid] = time.time()
        finally:
            os.close(fd)

    def died_at(self, pid: int) -> float | None:
        return self._deaths.get(pid)


class StderrRelay:
    """Copies a file to this process's stderr as it grows, until its writer died and all of it was copied."""

    def __init__(self, path: str, pid: int, deaths: DeathWatch) -> None:
        self.path, self.pid, self.deaths = path, pid, deaths
        threading.Thread(target=self._copy, name=f"stderr-relay-{pid}", daemon=True).start()

    def _copy(self) -> None:
        with contextlib.suppress(OSError), open(self.path, "rb") as source:
            while True:
                dead = self.deaths.died_at(self.pid) is not None
                data = source.read()
                if data:
                    sys.stderr.buffer.write(data)
                    sys.stderr.buffer.flush()
                elif dead:
                    return
                else:
                    time.sleep(RELAY_INTERVAL)


def capturing(logs_specs: LogsSpecs) -> tuple[LogsSpecs, bool]:
    """torch's logs specs with each worker's stderr sent to a file, and whether this agent must relay it.

    Only the default (torchrun's, with no redirect or tee asked for) is changed; anything a user chose is
    kept as it is (then `error_text` reads whatever files torch writes, if any).
    """
    if type(logs_specs) is not DefaultLogsSpecs:
        return logs_specs, False
    settings: Any = logs_specs
    if settings._redirects != Std.NONE or settings._tee != Std.NONE:
        return logs_specs, False
    return DefaultLogsSpecs(log_dir=logs_specs.root_log_dir, redirects=Std.ERR, tee=Std.NONE,
                            local_ranks_filter=settings._local_ranks_filter), True


def error_text(failure: ProcessFailure, stderr_path: str | None) -> str | None:
    """The worker's own account of its end: torch's error file (`@record`), else the end of its stderr."""
    recorded = recorded_error(failure.error_file)
    if recorded:
        return recorded
    if not stderr_path:
        return None
    try:
        with Path(stderr_path).open("rb") as file:
            size = file.seek(0, 2)
            file.seek(max(size - ERROR_TAIL_BYTES, 0))
            return file.read().decode("utf-8", "replace") or None
    except OSError:
        return None


def recorded_error(error_file: str) -> str | None:
    """The traceback (else the message) a worker's `@record` wrote to torch's error file
    (`$TORCHELASTIC_ERROR_FILE`); None without one, or one that does not parse."""
    try:
        data = json.loads(Path(error_file).read_text())
    except (OSError, ValueError):
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        traceback = message.get("extraInfo", {}).get("py_callstack")
        return str(traceback or message.get("message") or "") or None
    return str(message) if message else None
