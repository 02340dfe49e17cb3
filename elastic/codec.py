"""The store edge: every value read from etcd is decoded here, and only here (docs/design.md §3.13).

Anyone who can reach etcd can `etcdctl put` anything under `/elastic/`. A value that does not decode must
not crash whatever shares the store (the controller serving every job, the agents of a job): it becomes a
`CorruptValueError` naming the key, the problem and the fix, which the caller turns into a condition of
its own job. Decoding is strict (no "5" for 5, no true for 1), so a wrong shape is caught at the edge and
never deep inside a decision.

Wire models are pydantic models of the JSON as stored; each `decode_*` returns the project's own type.
The agents' per-round torch store (`store/<round>/`) holds torch's raw bytes and is not decoded here.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from elastic.errors import PermanentError
from elastic.policy.budget import Budget, Charge
from elastic.policy.incident import ERROR_CHARACTERS, RoundEnd
from elastic.spec import ElasticJob, SpecError, parse_job

CORRUPT_STATE = RoundEnd.CORRUPT_STATE.value  # a job whose keys do not decode: its status reason
STATUS_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
_SHOWN_CHARACTERS = 80  # of a bad value, in a message: enough to recognise it, never a whole blob

M = TypeVar("M", bound=BaseModel)

# Every number read from etcd is bounded: a value out of any sane range (a round of 10^26, a time in the year
# 30000) is a bad value of its own job (CorruptState, naming the key), never a stall or an overflow elsewhere.
MAX_COUNT = 2**31 - 1  # rounds, ranks, members, budgets, world sizes, pids
MAX_STEP = 2**53 - 1  # training steps: as large as a JSON number stays exact
MAX_SECONDS = 1e11  # epoch seconds: beyond the year 5000
MAX_LEASE = 2**63 - 1  # etcd lease ids and TTLs are int64
NonNegative = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Step = Annotated[int, Field(ge=0, le=MAX_STEP)]
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
ExitCode = Annotated[int, Field(ge=-MAX_COUNT, le=MAX_COUNT)]
LeaseNumber = Annotated[int, Field(ge=0, le=MAX_LEASE)]
RANK_BUCKETS = 48  # keys a run keeps its ranks in; which ones a seal wrote is a bitmask: an exact JSON number


class CorruptValueError(PermanentError):
    """A key's value does not decode. Never a worker failure, never charged: a condition of its job."""

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        self.problem = problem
        super().__init__(
            f"corrupt value at {key}: {problem}. Fix the key or delete it "
            f"(etcdctl del {key}); it was not written by this project's code"
        )


class _Wire(BaseModel):
    """A stored JSON object: strict types; keys we do not read are ignored (newer writers may add some)."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")


class RunRecord(_Wire):
    run_id: str
    lease: LeaseNumber | None = None
    ttl: LeaseNumber | None = None
    created_at: Seconds = 0.0
    by: str = ""


class MemberRecord(_Wire):
    round: NonNegative
    host: str = ""
    addr: str = ""
    pid: NonNegative = 0
    joined_at: Seconds = 0.0
    worker: str | None = None


class RoundRecord(_Wire):
    round: NonNegative
    sealed: bool = False
    opened_by: str = "Start"
    opened_at: Seconds = 0.0
    sealed_at: Seconds | None = None
    world_size: NonNegative = 0
    rank_buckets: Annotated[int, Field(ge=0, lt=2**RANK_BUCKETS)] = 0


class SealerRecord(_Wire):
    member: str
    at: Seconds = 0.0


class RankBucketRecord(_Wire):
    """One bucket of a sealed round's ranks: the round, and member id -> rank; and, written by the transaction
    that ends that round, which members of this bucket the round after it expects back (`Round.expected`)."""

    round: NonNegative
    ranks: dict[str, NonNegative]
    expected: list[str] = []



class ChargeRecord(_Wire):
    round: NonNegative
    reason: str
    cause: str
    exit_code: ExitCode | None = None
    member: str | None = None
    at: Seconds = 0.0


class BudgetRecord(_Wire):
    max: NonNegative
    used: NonNegative = 0
    charges: list[ChargeRecord] = []


ErrorText = Annotated[str, Field(max_length=ERROR_CHARACTERS)]


class ClosedRecord(_Wire):
    reason: str
    message: str
    at: Seconds = 0.0
    member: str | None = None
    error: ErrorText | None = None


class DepartureRecord(_Wire):
    reason: str
    round: NonNegative
    at: Seconds = 0.0


class DoneRecord(_Wire):
    round: NonNegative
    at: Seconds = 0.0


class FailureRecord(_Wire):
    """An agent's report of its workers' failure (`elastic.policy.incident.Failure`)."""

    exit_code: ExitCode | None
    reason: str | None = None
    member: str | None = None
    at: Seconds = 0.0
    error: ErrorText | None = None
    stopped: bool = False


class AliveRecord(_Wire):
    at: Seconds = 0.0


class ProgressRecord(_Wire):
    """What rank 0 reports (`examples/`); other keys it adds are kept out of the status. `total` (the steps
    the job will run) and `at` (when, epoch seconds) are optional: the live view shows an ETA with them."""

    step: Step
    loss: float | None = None
    world_size: NonNegative | None = None
    total: Step | None = None
    at: Seconds | None = None


class WorkerRecord(_Wire):
    """A local worker process as the controller started it (for adoption after a controller restart)."""

    pid: Annotated[int, Field(gt=0, le=MAX_COUNT)]
    started_at: Seconds
    log: str = ""


class WorkerLogRecord(_Wire):
    """Where a local worker's log is (`logs/<name>`), so that it can be found after the worker ended."""

    path: str
    started_at: Seconds = 0.0


class WorkerExitRecord(_Wire):
    """What an `elastic agent` recorded as it exited (so an adopting controller keeps its exit code)."""

    exit_code: ExitCode
    pid: Annotated[int, Field(gt=0, le=MAX_COUNT)]
    at: Seconds = 0.0


class LeaderKeyRecord(_Wire):
    """The acting local controller's key (`/elastic/controllers/leader`)."""

    holder: str


class ConditionRecord(_Wire):
    model_config = ConfigDict(strict=True, frozen=True, extra="allow")
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    lastTransitionTime: str

    @field_validator("lastTransitionTime")
    @classmethod
    def _time(cls, value: str) -> str:
        return _timestamp_text(value)


class StatusRecord(_Wire):
    """The fields of a job's status that the controller reads back; the rest is carried as written."""

    model_config = ConfigDict(strict=True, frozen=True, extra="allow")
    phase: Literal["Created", "Running", "Restarting", "Succeeded", "Failed"]
    conditions: list[ConditionRecord] = []
    startTime: str | None = None
    completionTime: str | None = None

    @field_validator("startTime", "completionTime")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        return None if value is None else _timestamp_text(value)


def _timestamp_text(value: str) -> str:
    try:
        datetime.strptime(value, STATUS_TIME_FORMAT).replace(tzinfo=timezone.utc)
    except ValueError:
        raise ValueError(f"expected a UTC time like 2026-01-31T12:00:00Z, got {shown(value)}") from None
    return value


# --- decoding ---


def decode_model(model: type[M], key: str, value: bytes | str) -> M:
    """One stored value as `model`, or CorruptValueError naming the key and the first problem."""
    try:
        return model.model_validate_json(value)
    except ValidationError as err:
        raise CorruptValueError(key, _first_problem(err, value)) from None


def decode_json_object(key: str, value: bytes | str) -> dict[str, Any]:
    """A value that must be a JSON object, kept as a plain mapping (the spec, before its own validation)."""
    try:
        data = json.loads(value)
    except (ValueError, UnicodeDecodeError) as err:
        raise CorruptValueError(key, f"not JSON ({err}): {shown(value)}") from None
    if not isinstance(data, dict):
        raise CorruptValueError(key, f"expected a JSON object, got {shown(value)}")
    return data


def decode_spec(key: str, value: bytes | str) -> ElasticJob:
    """A submitted ElasticJob, validated as `elastic validate` would."""
    try:
        return parse_job(decode_json_object(key, value))
    except SpecError as err:
        raise CorruptValueError(key, "; ".join(err.problems[:3])) from None


def decode_status(key: str, value: bytes | str) -> dict[str, Any]:
    """A job's status as the controller wrote it (validated, then kept as the mapping it is)."""
    decode_model(StatusRecord, key, value)
    return decode_json_object(key, value)


def status_for_display(key: str, value: bytes | str | None) -> dict[str, Any]:
    """A job's status for those who only show or check it (`elastic status`, a standing-by runner): {} when
    absent; when it does not decode, a status that says so, naming the key (the acting controller rewrites
    it at its next step)."""
    if value is None:
        return {}
    try:
        return decode_status(key, value)
    except CorruptValueError as err:
        return {"phase": "Unknown", "reason": CORRUPT_STATE, "message": str(err)}


def leader_holder(key: str, value: bytes | str) -> tuple[str, dict[str, Any]]:
    """Who holds the leader key, and what it says about itself. A value this project did not write still
    names a holder (its text): the key is held all the same, and only its holder may release it."""
    try:
        decode_model(LeaderKeyRecord, key, value)
        info = decode_json_object(key, value)
        return str(info["holder"]), info
    except CorruptValueError:
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        return text, {}


def decode_worker(key: str, value: bytes | str) -> WorkerRecord:
    return decode_model(WorkerRecord, key, value)


def decode_worker_log(key: str, value: bytes | str) -> WorkerLogRecord:
    return decode_model(WorkerLogRecord, key, value)


def decode_budget(key: str, value: bytes | str) -> Budget:
    record = decode_model(BudgetRecord, key, value)
    charges = tuple(Charge(**c.model_dump()) for c in record.charges)
    return Budget(record.max, record.used, charges)


def decode_progress(key: str, value: bytes | str) -> dict[str, Any]:
    return decode_model(ProgressRecord, key, value).model_dump(exclude_none=True)


def shown(value: Any) -> str:
    """A value as a message shows it: its start, never all of a huge blob."""
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return repr(text if len(text) <= _SHOWN_CHARACTERS else text[:_SHOWN_CHARACTERS] + "...")


def _first_problem(err: ValidationError, value: bytes | str) -> str:
    first = err.errors(include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"])
    if first["type"] == "json_invalid":
        return f"not JSON: {shown(value)}"
    if first["type"] == "model_type":
        return f"expected a JSON object, got {shown(value)}"
    return f"{where or 'value'}: {first['msg']} (got {shown(first.get('input'))})"
