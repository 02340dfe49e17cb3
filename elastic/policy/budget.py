"""The job-level retry budget (docs/design.md §3.2-3.4): pure arithmetic, no I/O.

The budget counts failure-caused round transitions of the whole job. A charge is keyed by the round it
ends, which makes charging idempotent: N agents (or a controller re-running a step after a crash) that
report the same incident charge it once. The transaction that ends the round writes the charged budget,
so the arithmetic here never races.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from elastic.policy.incident import RoundEnd


@dataclass(frozen=True)
class Charge:
    """One incident that cost a restart."""

    round: int  # the round the incident ended
    reason: str  # stable CamelCase: WorkerFailure, MemberLost, ...
    cause: str  # for people: what happened, where
    exit_code: int | None = None
    member: str | None = None
    at: float = 0.0


@dataclass(frozen=True)
class Budget:
    max: int
    used: int = 0
    charges: tuple[Charge, ...] = ()

    @property
    def exceeded(self) -> bool:
        """More failures than `maxRestarts` allows: the job must close."""
        return self.used > self.max

    @property
    def remaining(self) -> int:
        return max(self.max - self.used, 0)

    def to_json(self) -> dict[str, Any]:
        return {"max": self.max, "used": self.used, "charges": [asdict(c) for c in self.charges]}


def charge(budget: Budget, incident: Charge) -> Budget:
    """The budget after one incident. Charging the same round twice costs nothing more; the charge kept is the
    first, unless the later one amends it (`amends`)."""
    for index, existing in enumerate(budget.charges):
        if existing.round == incident.round:
            if not amends(incident, existing):
                return budget
            return replace(budget, charges=(*budget.charges[:index], incident, *budget.charges[index + 1:]))
    return replace(budget, used=budget.used + 1, charges=(*budget.charges, incident))


def amends(later: Charge, first: Charge) -> bool:
    """A member charged as lost, whose lease lapsed while etcd was away, names the cause itself once etcd is
    back: its worker's failure (exit code, error) is what ended the round, the lost lease only how the others
    heard of it. Its own report replaces the loss in the same charge (docs/design.md §3.11). So does any
    member's crash replace a loss that names nobody (a peer's group broke, and it could not tell whose end
    broke it): the crash is what broke it."""
    return (first.reason == RoundEnd.MEMBER_LOST.value and later.reason == RoundEnd.WORKER_FAILURE.value
            and later.member is not None and first.member in (None, later.member))


def exhausted_message(budget: Budget) -> str:
    """Why the job closed, naming the budget and the incident that spent it."""
    last = budget.charges[-1] if budget.charges else None
    where = f"; last: round {last.round}, {last.reason}: {last.cause}" if last else ""
    return f"restart budget spent: {budget.used} failure(s) > maxRestarts {budget.max}{where}"
