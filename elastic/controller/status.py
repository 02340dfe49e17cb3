"""The ElasticJob's status, derived from what the controller observes: pure.

Kubernetes conventions (and Kubeflow's condition types) so that the same object reads well in etcd, in
`elastic status` and in `kubectl get ej`: `phase`, `conditions[{type, status, reason, message,
lastTransitionTime}]` with stable CamelCase reasons, and plain counters.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from elastic.codec import CORRUPT_STATE, STATUS_TIME_FORMAT, CorruptValueError
from elastic.controller.reconcile import Observed, fitting, waiting_for_capacity
from elastic.policy.bounds import clamp_replicas
from elastic.policy.budget import Budget
from elastic.policy.capacity import CAPACITY_LIMITED, WAITING_FOR_CAPACITY
from elastic.rendezvous.state import JobState

CREATED, RUNNING, RESTARTING, SUCCEEDED, FAILED = "Created", "Running", "Restarting", "Succeeded", "Failed"
CONDITION_TYPES = (CREATED, RUNNING, RESTARTING, SUCCEEDED, FAILED)
FINAL_PHASES = (SUCCEEDED, FAILED)


TIME_FORMAT = STATUS_TIME_FORMAT


def timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime(TIME_FORMAT)


def parse_timestamp(text: str) -> float:
    return datetime.strptime(text, TIME_FORMAT).replace(tzinfo=timezone.utc).timestamp()


def phase_of(state: JobState) -> tuple[str, str, str]:
    """(phase, reason, message) of the rendezvous state alone: the controller's status and the live view
    (`elastic status -w`, which sees every round in the watch, also one the controller's poll missed)."""
    if state.closed is not None:
        phase = SUCCEEDED if state.closed.succeeded else FAILED
        return phase, state.closed.reason, state.closed.message
    current = state.round
    if current is None:
        return CREATED, "Created", "waiting for the run to be initialised"
    if current.sealed:
        return RUNNING, "RoundSealed", f"round {current.number} is training with {current.world_size} member(s)"
    if current.number == 0:
        return CREATED, "Gathering", "members are gathering for the first round"
    why = current.opened_by
    budget = state.budget
    if budget and budget.charges and budget.charges[-1].round == current.number - 1:
        why = f"{why}: {budget.charges[-1].cause}"
    return RESTARTING, current.opened_by, f"round {current.number - 1} ended ({why}); re-forming"


def restarts_taken(budget: Budget | None, max_restarts: int) -> tuple[int, int]:
    """(restarts taken, maxRestarts). The failure that spent the budget was charged but never restarted, so
    a job with maxRestarts 3 shows 3/3 when it fails on its 4th failure (the message says "4 failure(s) > 3")."""
    return (min(budget.used, budget.max), budget.max) if budget else (0, max_restarts)


def job_status(observed: Observed, previous: dict[str, Any] | None, progress: dict[str, Any] | None) -> dict[str, Any]:
    previous = previous or {}
    spec, state, now = observed.job.spec, observed.state, observed.now
    phase, reason, message = phase_of(state)
    waiting = waiting_for_capacity(observed)
    if waiting is not None and phase not in FINAL_PHASES:
        reason, message = WAITING_FOR_CAPACITY, waiting.message
    desired = clamp_replicas(spec.replicas, spec.min_replicas, spec.max_replicas)
    # Only ready workers are active (what /scale reports to an HPA): a pod pulling its image is not, nor a
    # spare waiting outside the round.
    ready = sum(1 for w in observed.workers if w.alive and w.ready and not w.stopping)
    spares = min(spec.spares, max(ready - desired, 0))  # up to spec.spares ready workers beyond the desired size
    active = ready - spares
    budget = state.budget
    used, limit = restarts_taken(budget, spec.failure_policy.max_restarts)
    status: dict[str, Any] = {
        "phase": phase,
        "reason": reason,
        "message": message,
        "conditions": _capacity_conditions(
            _waiting_condition(
                _conditions(previous.get("conditions", []), phase, reason, message, now),
                previous.get("conditions", []), observed, now,
            ),
            previous.get("conditions", []), observed, now,
        ),
        "round": state.round.number if state.round else 0,
        "worldSize": state.round.world_size if state.round and state.round.sealed else 0,
        "replicas": {"desired": desired, "active": active},
        "replicasText": f"{active}/{desired}",
        "restarts": {"used": used, "max": limit},
        "restartsText": f"{used}/{limit}",
        "startTime": previous.get("startTime") or timestamp(observed.started_at or now),
    }
    if spec.spares:
        status["spares"] = {"wanted": spec.spares, "ready": spares}
    if budget and budget.charges:
        last = budget.charges[-1]
        status["lastFailure"] = {
            "worker": last.member,
            "exitCode": last.exit_code,
            "reason": last.reason,
            "cause": last.cause,
            "round": last.round,
        }
    if progress:
        status["progress"] = {k: progress[k] for k in ("step", "loss", "world_size", "total") if k in progress}
    if phase in FINAL_PHASES:
        status["completionTime"] = previous.get("completionTime") or timestamp(now)
    return status


def corrupt_status(previous: dict[str, Any], error: CorruptValueError, now: float) -> dict[str, Any]:
    """The last status with a `CorruptState` condition naming the key; the phase stays as it was."""
    status = dict(previous) or {"phase": CREATED, "startTime": timestamp(now)}
    others = [c for c in status.get("conditions", []) if c.get("type") != CORRUPT_STATE]
    old = next((c for c in status.get("conditions", []) if c.get("type") == CORRUPT_STATE), None)
    since = old["lastTransitionTime"] if old and old.get("status") == "True" else timestamp(now)
    status["conditions"] = [*others, {"type": CORRUPT_STATE, "status": "True", "reason": CORRUPT_STATE,
                                      "message": str(error), "lastTransitionTime": since}]
    status["corrupt"] = {"key": error.key, "problem": error.problem}
    return status


WORKERS_WAITING = "WorkersWaiting"


def _waiting_condition(conditions: list[dict], previous: list[dict], observed: Observed, now: float) -> list[dict]:
    """`WorkersWaiting` True while a worker that should run cannot (its image does not pull, no node fits,
    its config is missing), with the first such reason and message; False once none is stuck. Without it
    a job sits in `Created` with nothing said."""
    stuck = sorted((w.name, w.waiting) for w in observed.workers if w.alive and not w.stopping and w.waiting)
    if stuck:
        name, waiting = stuck[0]
        reason, message = waiting.split(":", 1)[0], f"worker {name}: {waiting}" + (
            f" (and {len(stuck) - 1} more)" if len(stuck) > 1 else "")  # fmt: skip
    else:
        reason, message = "AllStarted", "every worker is running"
    return _flag(conditions, previous, WORKERS_WAITING, bool(stuck), reason, message, now)


def _capacity_conditions(conditions: list[dict], previous: list[dict], observed: Observed, now: float) -> list[dict]:
    """`WaitingForCapacity` True while a job that trained is below minReplicas (its time is when the wait
    began: `capacityTimeoutSeconds` counts from it); `CapacityLimited` True while it runs below its desired
    size because the machine has no room for more (local)."""
    waiting = waiting_for_capacity(observed)
    conditions = _flag(conditions, previous, WAITING_FOR_CAPACITY, waiting is not None,
                       waiting.reason if waiting else "", waiting.message if waiting else "", now,
                       ("EnoughWorkers", "at least minReplicas workers are ready"))
    limited = fitting(observed).limited if waiting is None else None
    return _flag(conditions, previous, CAPACITY_LIMITED, limited is not None, "LocalCapacity", limited or "", now,
                 ("DesiredSize", "every wanted worker runs"))


def _flag(
    conditions: list[dict], previous: list[dict], kind: str, true: bool, reason: str, message: str, now: float,
    otherwise: tuple[str, str] | None = None,
) -> list[dict]:
    """A condition that is shown once it was True: True with `reason`/`message`, then False (with `otherwise`
    as its reason and message, else the same ones); its time changes only when it flips."""
    old = next((c for c in previous if c.get("type") == kind), None)
    if not true and old is None:
        return conditions
    status = "True" if true else "False"
    if not true and otherwise is not None:
        reason, message = otherwise
    since = old["lastTransitionTime"] if old and old.get("status") == status else timestamp(now)
    condition = {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": since}
    return [*conditions, condition]


def condition_since(status: dict[str, Any], kind: str) -> float | None:
    """When a True condition of this status became True, at the latest (None: not True, or no time recorded).

    Condition times are whole seconds (Kubernetes' format): the end of that second is returned, so a timeout
    counted from it never fires early (it may fire up to a second late)."""
    found = next((c for c in status.get("conditions", []) if c.get("type") == kind), None)
    if not found or found.get("status") != "True" or not isinstance(found.get("lastTransitionTime"), str):
        return None
    try:
        return parse_timestamp(found["lastTransitionTime"]) + 1.0
    except ValueError:
        return None


def _conditions(previous: list[dict[str, Any]], phase: str, reason: str, message: str, now: float) -> list[dict]:
    """One condition per type seen; the phase's is True. A transition time changes only on a flip."""
    by_type = {c["type"]: c for c in previous}
    result = []
    for kind in CONDITION_TYPES:
        old = by_type.get(kind)
        is_now = kind == phase or (kind == CREATED and old is None and phase != CREATED)
        if old is None and not is_now:
            continue
        status = "True" if kind == phase else "False"
        changed = old is None or old["status"] != status
        result.append(
            {
                "type": kind,
                "status": status,
                "reason": reason if kind == phase else (old or {}).get("reason", kind),
                "message": message if kind == phase else (old or {}).get("message", ""),
                "lastTransitionTime": timestamp(now) if changed else old["lastTransitionTime"],
            }
        )
    return result
