"""The job's rendezvous state as plain data, parsed from etcd entries.

The protocol's decisions (`protocol.py`) read only these types, so they can be tested with no etcd.
Each record keeps the mod revision it was read at: a transaction that acts on a decision compares it,
so a decision taken on a stale view simply fails and is taken again on a fresh one.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from elastic.codec import (
    RANK_BUCKETS,
    AliveRecord,
    ClosedRecord,
    CorruptValueError,
    DepartureRecord,
    DoneRecord,
    FailureRecord,
    MemberRecord,
    RankBucketRecord,
    RoundRecord,
    RunRecord,
    SealerRecord,
    decode_budget,
    decode_model,
    decode_spec,
)
from elastic.policy.budget import Budget
from elastic.policy.incident import Failure, JobEnd
from elastic.spec import ElasticJob
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
    def decode(cls, key: str, member_id: str, value: bytes, mod_revision: int) -> Member:
        record = decode_model(MemberRecord, key, value)
        return cls(
            id=member_id,
            target=record.round,
            host=record.host,
            addr=record.addr,
            pid=record.pid,
            joined_at=record.joined_at,
            worker=record.worker,
            mod_revision=mod_revision,
        )


def bucket_of(member_id: str) -> int:
    """The bucket a member's rank is in, in every round: a stable hash, so that a member watches only its own
    bucket's key (about N / 48 members' ranks: at 1,024 members ~21, under 1 KiB)."""
    return zlib.crc32(member_id.encode()) % RANK_BUCKETS


def in_buckets(ranks: dict[str, int]) -> dict[int, dict[str, int]]:
    """A round's ranks split into the buckets that have members (the others are not written)."""
    split: dict[int, dict[str, int]] = {}
    for member_id, rank in ranks.items():
        split.setdefault(bucket_of(member_id), {})[member_id] = rank
    return split


def bucket_record(round_number: int, ranks: dict[str, int], expected: Iterable[str] = ()) -> dict[str, Any]:
    """One rank bucket's value (`RankBucketRecord`): a round's ranks of this bucket's members, and those of them
    the round after it expects back (written by the transaction that ends the round)."""
    record: dict[str, Any] = {"round": round_number, "ranks": ranks}
    expected = sorted(expected)
    if expected:
        record["expected"] = expected
    return record


def bucket_mask(buckets: Iterable[int]) -> int:
    """The round record's note of which buckets its seal wrote (bit b: bucket b)."""
    return sum(1 << b for b in set(buckets))


@dataclass(frozen=True)
class Round:
    """One round: open (members gather) or sealed (ranks fixed, training runs).

    The record itself stays small whatever the job's size (number, sealed, world size): the ranks live in
    bucket keys written by the sealing transaction, and what an open round expects in the same buckets, by the
    transaction that opened it (docs/design.md §3.20). `members`, `previous` and `expected` are assembled from
    those keys on a full read (the sealer, the controller, the CLI); a member's own read holds only its own
    bucket of each.
    """

    number: int
    sealed: bool = False
    members: dict[str, int] = field(default_factory=dict)  # member id -> rank, once sealed
    previous: dict[str, int] = field(default_factory=dict)  # ranks of the round before, for stable ranks
    opened_by: str = "Start"  # why the round before ended (Start, WorkerFailure, MemberLost, ScaleUp, ...)
    opened_at: float = 0.0
    sealed_at: float | None = None
    # Members of the round before that the incident found alive (they reported a failure or answered a peer's
    # report; after a silent loss, every member still holding a key), and a scale-up's newcomers: they are in
    # this round without writing their keys again, and nobody else is coming from that restart, so the round
    # need not wait out the last call (empty: no such knowledge). Written into the rank buckets by the
    # transaction that ended the round before: each member reads its own (docs/design.md §3.20).
    expected: tuple[str, ...] = ()
    size: int = 0  # the sealed round's world size, as recorded (its `members` may be one bucket of it)
    # Which rank buckets its seal (or, open, the end of the round before) wrote (`bucket_mask`): a member whose
    # bit is clear is not in the sealed round, or not expected in the open one; one whose bit is set knows that
    # its bucket's event of the same revision is on its way.
    rank_buckets: int = 0
    mod_revision: int = 0

    @property
    def world_size(self) -> int:
        return self.size or len(self.members)

    def wrote_bucket(self, bucket: int) -> bool:
        """Whether this round's seal wrote that bucket of ranks."""
        return bool(self.rank_buckets >> bucket & 1)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "round": self.number,
            "sealed": self.sealed,
            "opened_by": self.opened_by,
            "opened_at": self.opened_at,
        }
        if self.sealed:
            data.update(world_size=self.world_size, sealed_at=self.sealed_at)
        if self.rank_buckets:
            data.update(rank_buckets=self.rank_buckets)
        return data

    @classmethod
    def decode(cls, entry: Entry) -> Round:
        record = decode_model(RoundRecord, entry.key, entry.value)
        return cls(
            number=record.round,
            sealed=record.sealed,
            opened_by=record.opened_by,
            opened_at=record.opened_at,
            sealed_at=record.sealed_at,
            size=record.world_size,
            rank_buckets=record.rank_buckets,
            mod_revision=entry.mod_revision,
        )


@dataclass(frozen=True)
class Closed:
    """Why the job ended for every agent: BackoffLimitExceeded, FailJobRule, Succeeded, Deleted, ..."""

    reason: str
    message: str
    at: float = 0.0
    member: str | None = None  # the member (or worker) whose failure closed it, when one did (FailJobRule)
    error: str | None = None  # the tail of that member's worker's own error, as its agent captured it

    @property
    def succeeded(self) -> bool:
        return self.reason == JobEnd.SUCCEEDED

    def to_json(self) -> dict[str, Any]:
        record = {"reason": self.reason, "message": self.message, "at": self.at}
        optional = {"member": self.member, "error": self.error}
        return {**record, **{k: v for k, v in optional.items() if v is not None}}


@dataclass(frozen=True)
class Departure:
    """A member that left on purpose (finished, stopped by a signal, scaled down): not a loss."""

    reason: str  # Finished, Preempted, ScaleDown
    round: int
    at: float = 0.0


@dataclass(frozen=True)
class JobState:
    """Everything the protocol decides on, read at one revision.

    Parsing never raises: a value that does not decode is left out and listed in `corrupt` (key ->
    problem), so that whoever reads the state decides what a bad key means for *this* job only.
    """

    run_id: str | None = None
    job_lease: int | None = None
    job_ttl: int | None = None  # the job lease's TTL as its creator granted it: what its keepers refresh by
    round: Round | None = None
    members: dict[str, Member] = field(default_factory=dict)
    budget: Budget | None = None
    budget_revision: int = 0
    closed: Closed | None = None
    departed: dict[str, Departure] = field(default_factory=dict)
    spec: ElasticJob | None = None
    failures: dict[str, Failure] = field(default_factory=dict)  # member -> its failure reported in the current round
    done: dict[str, int] = field(default_factory=dict)  # member -> round in which its workers all exited 0
    alive: frozenset[str] = frozenset()  # members that answered a failure report of the current round
    sealer: str | None = None  # the member that seals rounds and watches the member keys (None: nobody yet)
    # True when every member key and rank bucket was read (the sealer, the controller, the CLI); False for a
    # member's own view, which holds its own member key and rank bucket only (docs/design.md §3.20).
    roster: bool = True
    revision: int = 0
    corrupt: dict[str, str] = field(default_factory=dict)  # key -> why its value does not decode

    def heard_from(self) -> frozenset[str]:
        """Members of the current round known alive during its incident: they reported or answered."""
        return frozenset(self.failures) | self.alive

    def corruption(self) -> CorruptValueError | None:
        """The first bad key, as the error an agent fails its rendezvous with (None: all keys decode)."""
        if not self.corrupt:
            return None
        key = min(self.corrupt)
        return CorruptValueError(key, self.corrupt[key])

    @classmethod
    def parse(cls, keys: JobKeys, entries: list[Entry], revision: int = 0, roster: bool = True) -> JobState:
        """`roster`: whether `entries` hold every member key and rank bucket (False: a member's own view)."""
        parser = _Parser(keys)
        for entry in entries:
            try:
                parser.add(entry)
            except CorruptValueError as err:
                parser.corrupt[err.key] = err.problem
        return parser.state(revision, roster)


def read_by_protocol(keys: JobKeys, key: str) -> bool:
    """Whether `key` is one a JobState is made of (the parser's keys below); the agents' store, progress, the
    status, worker records and exits decide nothing in the round protocol."""
    return key in (keys.run, keys.round, keys.budget, keys.closed, keys.spec, keys.sealer) or key.startswith(
        (keys.members_prefix, keys.membership_prefix, keys.departed_prefix, keys.done_prefix,
         keys.incidents_prefix, keys.alive_prefix))


class _Parser:
    """Sorts a job's entries by key into the fields of a JobState, each decoded by `elastic.codec`."""

    def __init__(self, keys: JobKeys) -> None:
        self.keys = keys
        self.fields: dict[str, Any] = {"members": {}, "departed": {}, "done": {}}
        self.ranks: dict[str, dict[str, int]] = {}  # round -> member -> rank, from its buckets
        self.expected: dict[str, list[str]] = {}  # round -> the members it expects
        self.reports: dict[str, tuple[str, Failure]] = {}
        self.answers: list[tuple[str, str]] = []
        self.corrupt: dict[str, str] = {}

    def add(self, entry: Entry) -> None:
        keys, key, value = self.keys, entry.key, entry.value
        if key.startswith(keys.members_prefix):  # most of the keys: checked first
            member_id = key[len(keys.members_prefix) :]
            self.fields["members"][member_id] = _member(key, member_id, value, entry.mod_revision)
        elif key == keys.run:
            run = decode_model(RunRecord, key, value)
            self.fields.update(run_id=run.run_id, job_lease=run.lease, job_ttl=run.ttl)
        elif key.startswith(keys.ranks_prefix):
            bucket = decode_model(RankBucketRecord, key, value)
            self.ranks.setdefault(str(bucket.round), {}).update(bucket.ranks)
            self.expected.setdefault(str(bucket.round + 1), []).extend(bucket.expected)
        elif key == keys.round:
            self.fields["round"] = Round.decode(entry)
        elif key == keys.sealer:
            self.fields["sealer"] = decode_model(SealerRecord, key, value).member
        elif key == keys.budget:
            self.fields["budget"], self.fields["budget_revision"] = decode_budget(key, value), entry.mod_revision
        elif key == keys.closed:
            self.fields["closed"] = Closed(**decode_model(ClosedRecord, key, value).model_dump())
        elif key == keys.spec:
            self.fields["spec"] = decode_spec(key, value)
        elif key.startswith(keys.departed_prefix):
            departure = decode_model(DepartureRecord, key, value)
            self.fields["departed"][key[len(keys.departed_prefix) :]] = Departure(**departure.model_dump())
        elif key.startswith(keys.done_prefix):
            self.fields["done"][key[len(keys.done_prefix) :]] = decode_model(DoneRecord, key, value).round
        elif key.startswith(keys.incidents_prefix):
            round_text, _, member_id = key[len(keys.incidents_prefix) :].partition("/")
            self.reports[member_id] = (round_text, Failure(**decode_model(FailureRecord, key, value).model_dump()))
        elif key.startswith(keys.alive_prefix):
            decode_model(AliveRecord, key, value)
            round_text, _, member_id = key[len(keys.alive_prefix) :].partition("/")
            self.answers.append((round_text, member_id))

    def state(self, revision: int, roster: bool) -> JobState:
        rnd: Round | None = self.fields.get("round")
        current = str(rnd.number) if rnd is not None else None
        if rnd is not None:
            rnd = dataclasses.replace(
                rnd,
                members=self.ranks.get(current, {}) if rnd.sealed else {},
                previous=self.ranks.get(str(rnd.number - 1), {}),
                expected=tuple(sorted(self.expected.get(current, ()))),
            )
        failures = {m: f for m, (r, f) in self.reports.items() if r == current}
        alive = frozenset(m for r, m in self.answers if r == current)
        return JobState(**{**self.fields, "round": rnd}, failures=failures, alive=alive, roster=roster,
                        revision=revision, corrupt=self.corrupt)


@functools.lru_cache(maxsize=8192)
def _member(key: str, member_id: str, value: bytes, mod_revision: int) -> Member:
    """Members are most of a job's keys and rarely change: each version is decoded once per process.

    A watched view is parsed again at every revision; without this, N members joining at once would make
    every one of them decode every member key at every join, O(N^3) JSON decoding in all.
    """
    return Member.decode(key, member_id, value, mod_revision)
