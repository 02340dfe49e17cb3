"""What an in-place agent tells its workers, through the environment (the one contract between the two).

torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, ...) describe the round a worker was started in; an
in-place worker outlives rounds, so it also gets what it needs to follow them itself: the etcd endpoints,
the job, and the member (its agent) whose rank in each sealed round gives the worker's own.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from elastic.policy.inplace import ABANDONED_EXIT, HUNG_EXIT
from elastic.store import EtcdAuth, JobKeys

__all__ = ["ABANDONED_EXIT", "HUNG_EXIT", "Heartbeat", "Marker", "WorkerContext"]

ENDPOINTS = "ELASTIC_INPLACE_ENDPOINTS"
JOB = "ELASTIC_INPLACE_JOB"
MEMBER = "ELASTIC_INPLACE_MEMBER"
AFTER_ROUND = "ELASTIC_INPLACE_AFTER_ROUND"
MARKER_DIR = "ELASTIC_INPLACE_MARKERS"
HANG_FACTOR = "ELASTIC_HANG_FACTOR"
HANG_FLOOR = "ELASTIC_HANG_FLOOR_SECONDS"


@dataclass(frozen=True)
class WorkerContext:
    endpoints: str
    job: JobKeys
    member: str
    local_rank: int
    local_world_size: int
    after_round: int | None = None  # a replacement joins only rounds after the one its predecessor died in
    marker_dir: str | None = None
    hang_factor: float = 10.0
    hang_floor_seconds: float = 10.0
    auth: EtcdAuth = field(default_factory=EtcdAuth)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WorkerContext | None:
        """The context an in-place agent set, or None under any other launcher (torchrun, a plain run)."""
        env = os.environ if environ is None else environ
        if not env.get(MEMBER):
            return None
        after = env.get(AFTER_ROUND)
        return cls(
            endpoints=env[ENDPOINTS],
            job=JobKeys.parse(env[JOB]),
            member=env[MEMBER],
            local_rank=int(env.get("LOCAL_RANK", "0")),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", "1")),
            after_round=int(after) if after else None,
            marker_dir=env.get(MARKER_DIR) or None,
            hang_factor=float(env.get(HANG_FACTOR) or 10.0),
            hang_floor_seconds=float(env.get(HANG_FLOOR) or 10.0),
            auth=EtcdAuth.from_env(env),
        )

    def env(self) -> dict[str, str]:
        """The variables that give a worker this context (auth travels as ELASTIC_ETCD_*, never here; the hang
        settings are the user's own ELASTIC_HANG_* variables, which the worker inherits)."""
        env = {
            ENDPOINTS: self.endpoints,
            JOB: f"{self.job.namespace}/{self.job.name}",
            MEMBER: self.member,
        }
        if self.after_round is not None:
            env[AFTER_ROUND] = str(self.after_round)
        if self.marker_dir:
            env[MARKER_DIR] = self.marker_dir
        return env


@dataclass(frozen=True)
class Marker:
    """What a worker that follows rounds tells its agent, in a file per local rank: that it does (so a
    membership change need not restart it), the last round it joined (a replacement for it joins only later
    rounds: the agent itself may already be in the next one), and the round whose group broke under it while
    that round still held (a peer vanished and nobody reported it: the agent ends the round for it)."""

    pid: int
    round: int | None = None
    broken: int | None = None

    def write(self, directory: str, local_rank: int) -> None:
        path = Path(directory, str(local_rank))
        partial = path.with_suffix(".partial")
        partial.write_text(" ".join("-" if v is None else str(v) for v in (self.pid, self.round, self.broken)))
        partial.replace(path)  # atomic: the agent never reads half a marker

    @classmethod
    def read(cls, directory: str | Path, local_rank: int) -> Marker | None:
        try:
            pid, round_text, broken = Path(directory, str(local_rank)).read_text().split()
            return cls(int(pid), _optional_int(round_text), _optional_int(broken))
        except (OSError, ValueError):
            return None


def _optional_int(text: str) -> int | None:
    return None if text == "-" else int(text)


class Heartbeat:
    """Where a worker is in its step, shared with its agent through a small memory-mapped file per local rank:
    what it does (`step`, `collective`, `idle`), since when (this host's monotonic clock, the same for every
    process here), and its step deadline (0: none yet).

    The worker's own watchdog is a thread of the worker: a stopped process (SIGSTOP, uninterruptible sleep,
    a paused VM) cannot run it. The agent reads this instead and acts on the same deadline (docs/design.md
    §3.15). Written on every change of activity without a system call (a store into shared memory); a
    sequence number, odd while a write is under way, lets the reader skip a torn value.
    """

    KINDS = ("idle", "step", "collective")
    _FORMAT = "=Qbdd"  # sequence, kind, since, deadline
    SIZE = struct.calcsize(_FORMAT)

    def __init__(self, path: str | Path, create: bool = False) -> None:
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, self.SIZE)
            self._map = mmap.mmap(fd, self.SIZE)
        finally:
            os.close(fd)
        self._sequence = 0

    @staticmethod
    def path(directory: str | Path, local_rank: int) -> Path:
        return Path(directory, f"heartbeat-{local_rank}")

    def write(self, kind: str, since: float, deadline: float | None) -> None:
        self._sequence += 1
        struct.pack_into("=Q", self._map, 0, self._sequence * 2 - 1)
        struct.pack_into(self._FORMAT, self._map, 0, self._sequence * 2 - 1, self.KINDS.index(kind), since,
                         deadline or 0.0)
        struct.pack_into("=Q", self._map, 0, self._sequence * 2)

    def read(self) -> tuple[str, float, float | None] | None:
        """(kind, since, deadline), or None while a write is under way or before the first."""
        sequence, kind, since, deadline = struct.unpack_from(self._FORMAT, self._map, 0)
        if sequence == 0 or sequence % 2 or struct.unpack_from("=Q", self._map, 0)[0] != sequence:
            return None
        return self.KINDS[kind], since, deadline or None

    def close(self) -> None:
        self._map.close()
