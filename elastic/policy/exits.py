"""Classify an incident's first cause: which failure rule, or which restartPolicy shorthand, decides
(docs/design.md §3.5). Which failure is the first cause is `elastic.policy.incident`'s choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from elastic.spec import ExitCodeOperator, RestartPolicy, Rule

if TYPE_CHECKING:  # the failure value lives with the incident, which classifies through this module
    from elastic.policy.incident import Failure

# Voluntary disruptions: the platform took the node away, the program did nothing wrong (docs/design.md §3.3).
PREEMPTION_REASONS = frozenset({"Evicted", "Preempted", "DisruptionTarget"})

SIGNAL_BASE = 128  # shells and Kubernetes report death by signal N as exit code 128+N

# Exit codes that say the command cannot run as written, so a retry fails the same way: Python's 2 (a script
# it cannot open, a command line argparse refuses), the shell's 126 (found, not executable) and 127 (not
# found). Permanent under every restartPolicy unless a rule names them (a misspelt script name otherwise
# spent the whole budget, one restart at a time).
WILL_FAIL_AGAIN = {2: "the command line cannot run (Python: a script it cannot open, or arguments refused)",
                   126: "the command cannot be executed", 127: "the command was not found"}


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


def _matches(rule: Rule, cause: Failure) -> bool:
    """Every condition the rule sets must hold; a condition the cause cannot answer does not hold."""
    return _codes_match(rule, cause) and (rule.on_reasons is None or cause.reason in rule.on_reasons)


def _codes_match(rule: Rule, cause: Failure) -> bool:
    if rule.on_exit_codes is None:
        return True
    if cause.code is None:  # a lost node has no exit code: neither In nor NotIn can be judged
        return False
    listed = cause.code in rule.on_exit_codes.values
    return listed == (rule.on_exit_codes.operator is ExitCodeOperator.IN)


def _shorthand(cause: Failure, policy: RestartPolicy) -> tuple[Action, str]:
    if policy is RestartPolicy.NEVER:
        return Action.FAIL_JOB, "restartPolicy Never fails the job on any failure"
    if policy is RestartPolicy.ON_FAILURE:
        return Action.RESTART_JOB, "restartPolicy OnFailure restarts on any failure"
    # ExitCode, Kubeflow's meaning: 1-127 is the program's own verdict (permanent); a signal death or a
    # lost node without an exit code is the environment's doing (retryable).
    if cause.code is not None and cause.code < SIGNAL_BASE:
        return Action.FAIL_JOB, "restartPolicy ExitCode treats exit codes 1-127 as permanent"
    return Action.RESTART_JOB, "restartPolicy ExitCode retries signal deaths (>= 128) and lost nodes"


def classify(cause: Failure, rules: Sequence[Rule], restart_policy: RestartPolicy | str) -> Decision:
    """Decide what one incident's first cause does: the first matching rule, else the shorthand.

    Preemption reasons that no rule names are free under every shorthand: a user who wants them
    charged says so with a rule. Exit codes that no rule names and that say the command cannot run
    (`WILL_FAIL_AGAIN`) are permanent under every shorthand. Exit code 0 is success, never an incident, so
    it is refused.
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
    if cause.code in WILL_FAIL_AGAIN:
        return Decision(Action.FAIL_JOB, None, f"{what}: {WILL_FAIL_AGAIN[cause.code]}, which a restart would "
                        "repeat: permanent by default (no rule matched; a rule naming the code overrides)")
    action, why = _shorthand(cause, RestartPolicy(restart_policy))
    return Decision(action, None, f"{what}: no rule matched; {why}")

