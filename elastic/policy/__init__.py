"""Pure decisions over plain data: exit classification, success, bounds, deadlines. No I/O here.

One concern per module, each with a table of cases in `tests/policy/`. May import `elastic.spec`.
"""

from elastic.policy.bounds import clamp_replicas, round_can_seal
from elastic.policy.deadline import deadline_exceeded, deadline_remaining
from elastic.policy.exits import PREEMPTION_REASONS, Action, Decision, classify
from elastic.policy.incident import Failure, Incident, JobEnd, RoundEnd, first_failure
from elastic.policy.success import SuccessOutcome, decide_success

__all__ = [
    "PREEMPTION_REASONS",
    "Action",
    "Decision",
    "Failure",
    "Incident",
    "JobEnd",
    "RoundEnd",
    "SuccessOutcome",
    "clamp_replicas",
    "classify",
    "deadline_exceeded",
    "deadline_remaining",
    "decide_success",
    "first_failure",
    "round_can_seal",
]
