"""One incident, from a worker's exit to the charge: the reasons, the failure value, its first cause.

A failure is one value all the way (docs/design.md §3.16): the agent that saw a worker die builds a
`Failure`, reports it to etcd under the round's incident key, and the round ends on the `first_failure`
among the reports of that round, classified into an `Incident` by the job's rules; the budget then keeps a
`Charge` of it. Three types, one name per layer: *failure* (a worker's end, as observed), *incident* (what
ended the round and what it costs), *charge* (what the budget remembers).

Why the first cause needs more than exit codes: when one worker of an all-reduce job dies, every peer's
collective fails and exits too, with the same exit code 1 a plain Python error gives, or 134 when gloo or
NCCL abort the process. Timestamps taken on different hosts disagree by more than that delay. So a failure
is judged first by its *evidence* (its own error beats a peer-connection error), and only among equals by
the time it died. Pure: no I/O, table-tested in `tests/policy/test_incident.py`.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum, IntEnum

from elastic.policy.exits import SIGNAL_BASE, Action, classify
from elastic.spec import RestartPolicy, Rule

ERROR_LINES = 12  # lines of a worker's own error kept with its failure (what `elastic status` shows)
ERROR_CHARACTERS = 2048  # at most this much of it: the report travels through etcd with every incident


class RoundEnd(str, Enum):
    """Why a round ended. Stable identifiers: they are stored in etcd, in budget charges and in logs."""

    START = "Start"  # no round ended: the first round of a run
    WORKER_FAILURE = "WorkerFailure"  # an agent reported that its workers failed
    MEMBER_LOST = "MemberLost"  # a member vanished: its lease lapsed, or it fell silent during an incident
    WORKER_EXITED = "WorkerExited"  # the controller saw a worker's agent process end
    SCALE_UP = "ScaleUp"
    SCALE_DOWN = "ScaleDown"
    PREEMPTED = "Preempted"  # a member stopped on purpose (a signal to its agent)
    FINISHED = "Finished"  # a member left with all its workers at exit 0
    STORE_UNAVAILABLE = "StoreUnavailable"  # etcd was away: every lease lapsed together, or ours could not reach it
    CORRUPT_STATE = "CorruptState"  # a member left because a key of the job does not decode
    ROUND_ENDED = "RoundEnded"  # someone else ended the round: nothing to decide, just re-join
    CLOSED = "Closed"  # the job is closed: nothing to decide, leave


class JobEnd(str, Enum):
    """Why a job closed for every agent (the `closed` key's reason and the Failed/Succeeded status reason)."""

    SUCCEEDED = "Succeeded"
    BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
    FAIL_JOB_RULE = "FailJobRule"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    STARTUP_TIMEOUT = "StartupTimeout"
    CAPACITY_TIMEOUT = "CapacityTimeout"
    WORKER_START_FAILED = "WorkerStartFailed"
    TOO_MANY_PROCESSES = "TooManyLocalProcesses"
    DELETED = "Deleted"
    CLOSED = "Closed"  # an agent closed it through torch's `set_closed()`


# Round ends that are free whatever the rules say: the controller or the user chose them, or neither the job
# nor its nodes did anything wrong (etcd was away, someone wrote a bad key) (docs/design.md §3.3, §3.11, §3.13).
FREE_ENDS = frozenset({RoundEnd.SCALE_DOWN, RoundEnd.SCALE_UP, RoundEnd.STORE_UNAVAILABLE, RoundEnd.CORRUPT_STATE})

# The platform reason of a member that vanished (Kubernetes' word for a pod whose node went away).
NODE_LOST = "NodeLost"

# What a worker's error output says when it died of a peer's death, not of its own fault: gloo's and the
# TCP store's socket errors, NCCL's aborts and watchdog, torch's wrappers of them (matched case-insensitively).
COLLATERAL_SIGNS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "econnreset",
    "distnetworkerror",
    "connection was likely closed",
    "remote process exited",
    "nccl communicator was aborted",
    "watchdog caught collective operation timeout",
    "process group broke",
)
SIGABRT_CODE = SIGNAL_BASE + signal.SIGABRT  # gloo and NCCL abort a process whose peer died
AMBIGUOUS_CODES = frozenset({1})  # what both a Python error and a broken collective exit with
_RANK_PREFIX = re.compile(r"^\[(rank|default)\d+\]:\s?")  # torch's (and torchrun --tee's) prefix of a worker's line


class Evidence(IntEnum):
    """How strongly a failure points at its own member as the incident's cause; lower is stronger."""

    OWN = 0  # a platform reason, a signal death, an exit code of its own, or an error of its own (ValueError)
    LOST = 1  # the member vanished: its lease lapsed, or it said nothing while its peers reported
    AMBIGUOUS = 2  # exit code 1 with no error text to tell a Python error from a broken collective
    UNKNOWN = 3  # nothing known: no exit code, no reason (stock torchrun tells its handler nothing)
    COLLATERAL = 4  # a peer-connection error, an abort of the collective library, a stop by its own agent


@dataclass(frozen=True)
class Failure:
    """One observed end of a worker or member: what the agent saw, reported to etcd as it is.

    `at` is when it died, as precisely as the observer knows (a process sentinel, not a monitor tick): among
    failures of equal evidence the earliest is the cause. `error` is the tail of the worker's own error (torch's
    error file where the script uses `@record`, else its stderr), bounded by `ERROR_LINES`/`ERROR_CHARACTERS`.
    """

    exit_code: int | None
    reason: str | None = None  # e.g. Evicted, Preempted, OOMKilled, NodeLost, DisruptionTarget
    member: str | None = None  # the member (agent) or worker whose end this is
    at: float = 0.0
    error: str | None = None
    stopped: bool = False  # its own agent stopped it (a SIGTERM of ours): never a cause

    @property
    def code(self) -> int | None:
        """The exit code as Kubernetes and shells report it: Python's -N (killed by signal N) is 128+N.

        One exception: a script that died of an uncaught exception of its own exits 1, but gloo's threads can
        turn that into an abort at interpreter teardown ("terminate called without an active exception", 134).
        The script's verdict is the exception's, so it reads as 1, and rules on exit code 1 apply to it.
        """
        if self.exit_code is None:
            return None
        code = SIGNAL_BASE - self.exit_code if self.exit_code < 0 else self.exit_code
        if code == SIGABRT_CODE and self.error_line is not None and not _collateral_text(self.error):
            return 1
        return code

    @property
    def signal_death(self) -> bool:
        return self.code is not None and self.code >= SIGNAL_BASE

    @property
    def evidence(self) -> Evidence:
        if self.reason == NODE_LOST and self.exit_code is None:
            return Evidence.LOST  # inferred from a lease or a silence (a platform's NodeLost with a code is its own)
        if self.reason is not None:
            return Evidence.OWN
        if self.stopped or _collateral_text(self.error) or self.code == SIGABRT_CODE:
            return Evidence.COLLATERAL
        if self.code is None:
            return Evidence.UNKNOWN
        if self.code in AMBIGUOUS_CODES and not self.error:
            return Evidence.AMBIGUOUS
        return Evidence.OWN

    @property
    def error_line(self) -> str | None:
        """The line of its error that says what went wrong: the last exception line (`ValueError: ...`); None
        when there is none (the last line of a killed worker's output is no cause: a progress line, a warning)."""
        if not self.error:
            return None
        lines = [_RANK_PREFIX.sub("", line).strip() for line in self.error.splitlines() if line.strip()]
        exceptions = [line for line in lines if _exception_line(line)]
        return exceptions[-1] if exceptions else None

    def describe(self) -> str:
        """'OOMKilled, exit code 137 (SIGKILL) of worker n1/0' for status messages and logs."""
        parts = [self.reason] if self.reason else []
        if self.code is not None:
            parts.append(f"exit code {self.code}{_signal_name(self.code)}")
        text = ", ".join(parts) or "an unknown cause"
        text = f"{text} of worker {self.member}" if self.member else text
        line = self.error_line
        return f"{text}: {line}" if line and self.evidence is not Evidence.COLLATERAL else text


def bounded_error(text: str | None) -> str | None:
    """The tail of an error output as a failure keeps it: its last lines, at most `ERROR_CHARACTERS`."""
    if not text or not text.strip():
        return None
    tail = "\n".join(text.strip().splitlines()[-ERROR_LINES:])
    return tail[-ERROR_CHARACTERS:]


def _collateral_text(error: str | None) -> bool:
    if not error:
        return False
    lowered = error.lower()
    return any(sign in lowered for sign in COLLATERAL_SIGNS)


def _exception_line(line: str) -> bool:
    """'ValueError: bad batch', 'torch.OutOfMemoryError: ...', 'KeyboardInterrupt': a Python exception line."""
    head = line.split(":", 1)[0]
    name = head.rsplit(".", 1)[-1]
    return " " not in head and (name.endswith(("Error", "Exception", "Interrupt", "Exit")) or name == "Warning")


def _signal_name(code: int) -> str:
    if code <= SIGNAL_BASE:
        return ""
    try:
        return f" ({signal.Signals(code - SIGNAL_BASE).name})"
    except ValueError:
        return ""


def first_failure(reports: Iterable[Failure], silent: Iterable[str] = ()) -> Failure:
    """The cause of an incident among what its observers reported (docs/design.md §3.16).

    `silent`: members of the round that neither reported nor answered while their peers did: each counts as a
    lost member, so a survivor whose workers only broke with the lost one's connections is never blamed.
    Order: the strongest evidence, then a platform's reason (it knows more than an exit code), then the
    earliest death, then a signal death; remaining ties keep input order (reports, then silent members).
    """
    candidates = [*reports, *(Failure(None, reason=NODE_LOST, member=m) for m in silent)]
    if not candidates:
        raise ValueError("an incident needs at least one cause")
    return min(candidates, key=lambda f: (f.evidence, f.reason is None, f.at, not f.signal_death))


def silent_members(members: Iterable[str], heard_from: Iterable[str], departed: Iterable[str]) -> list[str]:
    """Members of a round that said nothing during its incident and did not leave on purpose, in rank order."""
    heard, left = set(heard_from), set(departed)
    return [m for m in members if m not in heard and m not in left]


@dataclass(frozen=True)
class Incident:
    """What ended a round and what it costs: the reason, the first failure (if one), the action and why."""

    reason: RoundEnd
    failure: Failure | None = None
    action: Action = Action.IGNORE
    why: str = ""  # for people: the cause and what decided
    rule_index: int | None = None  # index into failurePolicy.rules, None when a shorthand decided

    @property
    def charged(self) -> bool:
        return self.action is Action.RESTART_JOB

    def describe(self) -> str:
        return self.failure.describe() if self.failure is not None else self.reason.value


def incident_of(
    reason: RoundEnd,
    failure: Failure | None,
    rules: Iterable[Rule] = (),
    restart_policy: RestartPolicy | str = RestartPolicy.ON_FAILURE,
) -> Incident:
    """Classify a round end: free ends and ends without a failure cost nothing; a failure goes by the rules."""
    if reason in FREE_ENDS or failure is None:
        return Incident(reason, failure)
    decision = classify(failure, tuple(rules), restart_policy)
    return Incident(reason, failure, decision.action, decision.reason_text, decision.rule_index)


def incident_from_reports(
    reports: Mapping[str, Failure],
    silent: Iterable[str],
    rules: Iterable[Rule] = (),
    restart_policy: RestartPolicy | str = RestartPolicy.ON_FAILURE,
) -> Incident:
    """The incident a round ends on when agents reported failures: a lost member if the first cause is one."""
    first = first_failure(reports.values(), silent)
    reason = RoundEnd.MEMBER_LOST if first.evidence is Evidence.LOST else RoundEnd.WORKER_FAILURE
    return incident_of(reason, first, rules, restart_policy)
