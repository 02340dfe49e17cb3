"""Reading the process table (Linux /proc): which processes an agent started, and whether one is alive;
and the one link that ties a worker's life to its agent's.

torch starts training processes in sessions of their own, so neither a process group nor a session
finds them: only the parent links do.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable
from pathlib import Path

from elastic.cluster import reaper

REAPER_PATH = str(Path(reaper.__file__).resolve()).encode()

PR_SET_PDEATHSIG = 1


def _resolve_prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: nothing ties a child to its parent
        return None


# Resolved once, in the parent, on import: `die_with_parent` runs in a freshly forked child, where loading a
# library could wait for a lock that another thread of the parent held at the fork.
_PRCTL = _resolve_prctl()


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; run in the child, before it runs
    anything of its own): a worker whose agent was SIGKILLed must not train on unsupervised, writing the
    checkpoint directory the next agents resume from. Only a system call here: no import, no library load."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before the call above
        os._exit(1)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def process_state(pid: int) -> str | None:
    """The process's state letter (R running, S sleeping, D uninterruptible, T stopped, Z zombie, ...)."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def children_of(pid: int) -> list[int]:
    result = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields and fields[1] == str(pid) and fields[0] != "Z":
                result.append(int(entry.name))
    return sorted(result)


def training_processes(agent_pid: int) -> list[int]:
    """An agent's workers: its children, except that an in-place agent's workers are the children of its
    zygote (a multiprocessing forkserver, itself a child of the agent, beside a resource tracker), and that
    the agent's reaper (elastic.cluster.reaper) is no worker."""
    result = []
    for child in children_of(agent_pid):
        helper = _helper(child)
        if helper == "forkserver":
            result.extend(children_of(child))
        elif helper is None:
            result.append(child)
    return sorted(result)


def _helper(pid: int) -> str | None:
    """'forkserver' or 'resource_tracker' for the standard library's helper processes, 'reaper' for the
    agent's reaper, else None."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    for helper in ("forkserver", "resource_tracker"):
        if f"from multiprocessing.{helper} import".encode() in command:
            return helper
    if command.rstrip(b"\0").split(b"\0")[-3:-2] == [REAPER_PATH]:
        return "reaper"
    return None


def descendants_of(pid: int) -> list[int]:
    """Children, grandchildren, ...: an agent's training processes and whatever they started."""
    result, frontier = [], [pid]
    while frontier:
        kids = children_of(frontier.pop())
        result.extend(kids)
        frontier.extend(kids)
    return result


def is_running(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def environ_of(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return []
    return [item.decode(errors="replace") for item in raw.split(b"\0") if item]


def is_worker(pid: int, name: str) -> bool:
    """pid is alive and is that worker's agent or one of its processes (pids get reused: a record's pid
    may belong to an unrelated process by now, which must never be adopted or signalled)."""
    return is_running(pid) and f"ELASTIC_WORKER={name}" in environ_of(pid)


def pids_with_env(prefix: str) -> list[int]:
    """Running processes with an environment entry starting with `prefix` (e.g. `ELASTIC_WORKER=job-`)."""
    return sorted(
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit()
        and is_running(int(entry.name))
        and any(item.startswith(prefix) for item in environ_of(int(entry.name)))
    )


def agent_of_worker(name: str) -> int | None:
    """The running agent process of worker `name`, found by what can be verified when its record cannot be
    read: its environment names the worker, and its parent's does not (its training processes inherit the
    environment; the agent is the top one). None when no process of that worker runs."""
    found = [pid for pid in pids_with_env(f"ELASTIC_WORKER={name}") if is_worker(pid, name)]
    tops = [pid for pid in found if (_stat_fields(pid) or ["", "0"])[1] not in {str(p) for p in found}]
    return min(tops) if tops else None
