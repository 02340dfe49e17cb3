"""The job's rendezvous state as plain data, parsed from etcd entries.

The protocol's decisions (`protocol.py`) read only these types, so they can be tested with no etcd.
Each record keeps the mod revision it was read at: a transaction that acts on a decision compares it,
so a decision taken on a stale view simply fails and is taken again on a fresh one.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any

from elastic.policy.budget import Budget
from elastic.policy.exits import ExitCause
from elastic.store import Entry, JobKeys


@dataclass(frozen=True)
class Member:
    """One agent taking part in rendezvous; its key lives with its lease."""

    id: str
    target: int  # the round this member waits for (or is in)
    host: str = ""
    addr: str = ""
    pid: int = 0
    joined_at: float = 0.0
    worker: str | None = None  # the controller's name for the process running this agent, if any
    mod_revision: int = 0

    def to_json(self) -> dict[str, Any]:
        data = {
            "round": self.target,
            "host": self.host,
            "addr": self.addr,
            "pid": self.pid,
            "joined_at": self.joined_at,
        }
        if self.worker:
            data["worker"] = self.worker
        return data

    @classmethod
    def from_json(cls, member_id: str, value: bytes, mod_revision: int) -> Member:
        data = json.loads(value)
        return cls(
            id=member_id,
            target=int(data["round"]),
            host=data.get("host", ""),
            addr=data.get("addr", ""),
            pid=int(data.get("pid", 0)),
            joined_at=float(data.get("joined_at", 0.0)),
            worker=data.get("worker"),
            mod_revision=mod_revision,
        )


@dataclass(frozen=True)
class Round:
    """One round: open (members gather) or sealed (ranks fixed, training runs)."""

    number: int
    sealed: bool = False
    members: dict[str, int] = field(default_factory=dict)  # member id -> rank, once sealed
    previous: dict[str, int] = field(default_factory=dict)  # ranks of the round before, for stable ranks
    opened_by: str = "Start"  # why the round before ended (Start, WorkerFailure, MemberLost, ScaleUp, ...)
    opened_at: float = 0.0
    sealed_at: float | None = None
    # Members of the round before that were heard from during its incident (reported a failure or answered
    # a peer's report), hence alive and restarting: once those still holding a key are back, nobody else is
    # coming from that restart and the round need not wait out the last call (empty: no such knowledge).
    expected: tuple[str, ...] = ()
    mod_revision: int = 0

    @property
    def world_size(self) -> int:
        return len(self.members)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "round": self.number,
            "sealed": self.sealed,
            "members": self.members,
            "previous": self.previous,
            "opened_by": self.opened_by,
            "opened_at": self.opened_at,
        }
        if self.expected:
            data["expected"] = list(self.expected)
        if self.sealed:
            data["world_size"] = self.world_size
            data["sealed_at"] = self.sealed_at
        return data

    @classmethod
    def from_entry(cls, entry: Entry) -> Round:
        data = entry.json()
        return cls(
            number=int(data["round"]),
            sealed=bool(data.get("sealed", False)),
            members={k: int(v) for k, v in data.get("members", {}).items()},
            previous={k: int(v) for k, v in data.get("previous", {}).items()},
            opened_by=data.get("opened_by", "Start"),
            opened_at=float(data.get("opened_at", 0.0)),
            sealed_at=data.get("sealed_at"),
            expected=tuple(data.get("expected", ())),
            mod_revision=entry.mod_revision,
        )


@dataclass(frozen=True)
class Closed:
    """Why the job ended for every agent: BackoffLimitExceeded, FailJobRule, Succeeded, Deleted, ..."""

    reason: str
    message: str
    at: float = 0.0

    @property
    def succeeded(self) -> bool:
        return self.reason == "Succeeded"

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "message": self.message, "at": self.at}


@dataclass(frozen=True)
class Departure:
    """A member that left on purpose (finished, stopped by a signal, scaled down): not a loss."""

    reason: str  # Finished, Preempted, ScaleDown
    round: int
    at: float = 0.0


@dataclass(frozen=True)
class JobState:
    """Everything the protocol decides on, read at one revision."""

    run_id: str | None = None
    job_lease: int | None = None
    round: Round | None = None
    members: dict[str, Member] = field(default_factory=dict)
    budget: Budget | None = None
    budget_revision: int = 0
    closed: Closed | None = None
    departed: dict[str, Departure] = field(default_factory=dict)
    spec: dict[str, Any] | None = None
    causes: dict[str, ExitCause] = field(default_factory=dict)  # failures reported in the current round
    done: dict[str, int] = field(default_factory=dict)  # member -> round in which its workers all exited 0
    alive: frozenset[str] = frozenset()  # members that answered a failure report of the current round
    revision: int = 0

    def heard_from(self) -> frozenset[str]:
        """Members of the current round known alive during its incident: they reported or answered."""
        return frozenset(self.causes) | self.alive

    @classmethod
    def parse(cls, keys: JobKeys, entries: list[Entry], revision: int = 0) -> JobState:
        run_id = job_lease = rnd = budget = closed = spec = None
        budget_revision = 0
        members: dict[str, Member] = {}
        departed: dict[str, Departure] = {}
        reports: dict[str, tuple[str, ExitCause]] = {}
        answers: list[tuple[str, str]] = []
        done: dict[str, int] = {}
        members_prefix = keys.members_prefix
        for entry in entries:
            key = entry.key
            if key.startswith(members_prefix):  # most of the keys: checked first
                member_id = key[len(members_prefix) :]
                members[member_id] = _member(member_id, entry.value, entry.mod_revision)
            elif key == keys.run:
                data = entry.json()
                run_id, job_lease = data.get("run_id"), data.get("lease")
            elif key == keys.round:
                rnd = Round.from_entry(entry)
            elif key == keys.budget:
                budget, budget_revision = Budget.from_json(entry.json()), entry.mod_revision
            elif key == keys.closed:
                closed = Closed(**entry.json())
            elif key == keys.spec:
                spec = entry.json()
            elif key.startswith(keys.departed_prefix):
                departed[key[len(keys.departed_prefix) :]] = Departure(**entry.json())
            elif key.startswith(keys.done_prefix):
                done[key[len(keys.done_prefix) :]] = int(entry.json()["round"])
            elif key.startswith(keys.incidents_prefix):
                round_text, _, member_id = key[len(keys.incidents_prefix) :].partition("/")
                reports[member_id] = (round_text, ExitCause(**entry.json()))
            elif key.startswith(keys.alive_prefix):
                round_text, _, member_id = key[len(keys.alive_prefix) :].partition("/")
                answers.append((round_text, member_id))
        current = str(rnd.number) if rnd is not None else None
        causes = {m: c for m, (r, c) in reports.items() if r == current}
        alive = frozenset(m for r, m in answers if r == current)
        return cls(
            run_id, job_lease, rnd, members, budget, budget_revision, closed, departed, spec, causes, done, alive,
            revision,
        )


@functools.lru_cache(maxsize=8192)
def _member(member_id: str, value: bytes, mod_revision: int) -> Member:
    """Members are most of a job's keys and rarely change: each version is decoded once per process.

    A watched view is parsed again at every revision; without this, N members joining at once would make
    every one of them decode every member key at every join, O(N^3) JSON decoding in all.
    """
    return Member.from_json(member_id, value, mod_revision)
