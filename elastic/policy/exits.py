"""Classify why a round ended: which failure rule, or which restartPolicy shorthand, decides (DESIGN §3.5).

One incident often kills every worker of an all-reduce job: the root cause (a SIGKILL, an eviction) is
followed by collateral exit-1s of the others. The budget is charged per incident, so the decision must
be taken on the *first cause* only; `first_cause` picks it, `classify` decides what it costs.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from elastic.spec import ExitCodeOperator, RestartPolicy, Rule

# Voluntary disruptions: the platform took the node away, the program did nothing wrong (DESIGN §3.3).
PREEMPTION_REASONS = frozenset({"Evicted", "Preempted", "DisruptionTarget"})

_SIGNAL_BASE = 128  # shells and Kubernetes report death by signal N as exit code 128+N


@dataclass(frozen=True)
class ExitCause:
    """One observed end of a worker or member: an exit code, a platform reason, or both."""

    exit_code: int | None
    reason: str | None = None  # e.g. Evicted, Preempted, OOMKilled, NodeLost, DisruptionTarget
    worker: str | None = None
    at: float = 0.0  # when it was observed; only compared between causes of one incident

    @property
    def code(self) -> int | None:
        """The exit code as Kubernetes and shells report it: Python's -N (killed by signal N) is 128+N."""
        if self.exit_code is not None and self.exit_code < 0:
            return _SIGNAL_BASE - self.exit_code
        return self.exit_code

    @property
    def signal_death(self) -> bool:
        return self.code is not None and self.code >= _SIGNAL_BASE

    def describe(self) -> str:
        """'OOMKilled, exit code 137 (SIGKILL) of worker n1/0' for status messages and logs."""
        parts = [self.reason] if self.reason else []
        if self.code is not None:
            parts.append(f"exit code {self.code}{_signal_name(self.code)}")
        text = ", ".join(parts) or "an unknown cause"
        return f"{text} of worker {self.worker}" if self.worker else text


def _signal_name(code: int) -> str:
    if code <= _SIGNAL_BASE:
        return ""
    try:
        return f" ({signal.Signals(code - _SIGNAL_BASE).name})"
    except ValueError:
        return ""


class Action(str, Enum):
    """What an incident does to the job; the values are those of the spec's `RuleAction`."""

    FAIL_JOB = "FailJob"  # permanent: close the job now
    RESTART_JOB = "RestartJob"  # charge the budget, re-rendezvous
    IGNORE = "Ignore"  # re-rendezvous without a charge


@dataclass(frozen=True)
class Decision:
    action: Action
    rule_index: int | None  # index into failurePolicy.rules, None when a shorthand decided
    reason_text: str  # for people: the cause and what decided


def _matches(rule: Rule, cause: ExitCause) -> bool:
    """Every condition the rule sets must hold; a condition the cause cannot answer does not hold."""
    return _codes_match(rule, cause) and (rule.on_reasons is None or cause.reason in rule.on_reasons)


def _codes_match(rule: Rule, cause: ExitCause) -> bool:
    if rule.on_exit_codes is None:
        return True
    if cause.code is None:  # a lost node has no exit code: neither In nor NotIn can be judged
        return False
    listed = cause.code in rule.on_exit_codes.values
    return listed == (rule.on_exit_codes.operator is ExitCodeOperator.IN)


def _shorthand(cause: ExitCause, policy: RestartPolicy) -> tuple[Action, str]:
    if policy is RestartPolicy.NEVER:
        return Action.FAIL_JOB, "restartPolicy Never fails the job on any failure"
    if policy is RestartPolicy.ON_FAILURE:
        return Action.RESTART_JOB, "restartPolicy OnFailure restarts on any failure"
    # ExitCode, Kubeflow's meaning: 1-127 is the program's own verdict (permanent); a signal death or a
    # lost node without an exit code is the environment's doing (retryable).
    if cause.code is not None and cause.code < _SIGNAL_BASE:
        return Action.FAIL_JOB, "restartPolicy ExitCode treats exit codes 1-127 as permanent"
    return Action.RESTART_JOB, "restartPolicy ExitCode retries signal deaths (>= 128) and lost nodes"


def classify(cause: ExitCause, rules: Sequence[Rule], restart_policy: RestartPolicy | str) -> Decision:
    """Decide what one incident's first cause does: the first matching rule, else the shorthand.

    Preemption reasons that no rule names are free under every shorthand: a user who wants them
    charged says so with a rule. Exit code 0 is success, never an incident, so it is refused.
    """
    if cause.code == 0:
        raise ValueError(f"exit code 0 is success, not a failure to classify ({cause.describe()})")
    what = cause.describe()
    for index, rule in enumerate(rules):
        if _matches(rule, cause):
            action = Action(rule.action.value)
            return Decision(action, index, f"{what} matched failurePolicy.rules[{index}] ({action.value})")
    if cause.reason in PREEMPTION_REASONS:
        return Decision(Action.IGNORE, None, f"{what} is a preemption, free by default (no rule matched)")
    action, why = _shorthand(cause, RestartPolicy(restart_policy))
    return Decision(action, None, f"{what}: no rule matched; {why}")


def first_cause(causes: Iterable[ExitCause]) -> ExitCause:
    """The root cause of an incident among what its observers reported.

    When one worker of an all-reduce job dies, every other worker's collective fails and its process exits
    with 1 (an exception) or 134 (SIGABRT: gloo and NCCL abort the process on a lost peer). Observers on
    different hosts stamp their reports with clocks that disagree by more than that delay, so time alone
    cannot tell root from collateral. Hence the order: a platform reason (Evicted, OOMKilled) first; then an
    exit code other than the collateral ones; then the earliest; then a signal death. Remaining ties keep
    input order.
    """
    ordered = list(causes)
    if not ordered:
        raise ValueError("an incident needs at least one cause")
    return min(
        ordered,
        key=lambda cause: (cause.reason is None, cause.code in COLLATERAL_CODES, cause.at, not cause.signal_death),
    )


# What a worker exits with when a peer's death broke its collective: an exception, or an abort.
COLLATERAL_CODES = frozenset({1, 134, None})
