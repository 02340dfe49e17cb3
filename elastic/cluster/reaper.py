"""Workers never outlive their agent, whoever started the agent.

torch's agent starts each worker in a session of its own, so an agent killed outright (SIGKILL, the OOM
killer) leaves its workers training unsupervised: under stock `torchrun --rdzv-backend=etcd-v3` they wrote
the checkpoint the next round resumed from (issue 44). `elastic agent` arms the kernel's parent-death signal
in each worker; stock torchrun cannot be asked to. So the rendezvous backend, which runs inside any agent,
starts this reaper once per agent process:

- the agent marks its environment with a token (`REAP_TOKEN`) before it starts any worker: every worker and
  every process a worker forks inherits it, and /proc shows it to the same user whatever became of the
  process's parent;
- the reaper is a separate small process (this file run by path: the standard library only, no torch, no
  gRPC), not a fork of the agent; it waits on the agent's pidfd (or polls its parent where pidfds are
  missing) and, once the agent is gone, SIGKILLs every process carrying the token, scanning again until a
  scan finds none (a worker caught mid-fork).

The decision of whom to end is `carries_token`, a pure function of a process's environment block.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

REAP_TOKEN = "ELASTIC_REAP_TOKEN"
SCAN_AGAIN_SECONDS = 0.2
SCANS_AFTER_THE_LAST_KILL = 5  # empty scans in a row before the reaper believes every carrier is gone
POLL_PARENT_SECONDS = 0.5


def carries_token(environ_block: bytes, token: str) -> bool:
    """Whether a process's /proc/<pid>/environ block (NUL-separated) holds this agent's token."""
    return f"{REAP_TOKEN}={token}".encode() in environ_block.split(b"\0")


def guard_this_agent() -> str:
    """Mark this process's environment and start its reaper, once per process; returns the token.

    Call before the agent starts workers (the token reaches them through the environment they inherit). A
    process that forked from a guarded one is an agent of its own (torch's test suites fork agents): it gets
    a token and a reaper of its own.
    """
    current = os.environ.get(REAP_TOKEN, "")
    if current.startswith(f"{os.getpid()}-"):
        return current
    token = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    env = {k: v for k, v in os.environ.items() if k != REAP_TOKEN}  # the reaper must not carry the token
    subprocess.Popen(
        [sys.executable, "-I", "-S", str(Path(__file__).resolve()), str(os.getpid()), token],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=None, start_new_session=True,
    )  # fmt: skip
    os.environ[REAP_TOKEN] = token
    return token


def wait_for_exit(pid: int) -> None:
    """Return once process `pid` (this process's parent at start) has exited."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    if os.getppid() != pid:  # gone before the pidfd was opened: nothing to wait for
        return
    if pidfd is not None:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        while not poller.poll():
            pass
        os.close(pidfd)
        return
    while os.getppid() == pid:
        time.sleep(POLL_PARENT_SECONDS)


def carriers(token: str) -> Iterator[int]:
    """Every process of this user whose environment holds the token (never this one)."""
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        with contextlib.suppress(OSError):
            if carries_token((entry / "environ").read_bytes(), token):
                yield int(entry.name)


def reap(token: str) -> int:
    """SIGKILL every carrier of the token until none is left; returns how many were ended."""
    ended: set[int] = set()
    quiet = 0
    while quiet < SCANS_AFTER_THE_LAST_KILL:
        found = list(carriers(token))
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                ended.add(pid)
        quiet = 0 if found else quiet + 1
        time.sleep(SCAN_AGAIN_SECONDS)
    return len(ended)


def main(argv: list[str]) -> None:
    agent, token = int(argv[0]), argv[1]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the agent's terminal is the agent's to handle
    wait_for_exit(agent)
    ended = reap(token)
    if ended:
        print(f"elastic: agent {agent} is gone; ended {ended} of its processes that outlived it",
              file=sys.stderr, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
