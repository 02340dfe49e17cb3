"""`activeDeadlineSeconds` (docs/design.md §3.8): a job running longer fails with reason `DeadlineExceeded`.

Times are seconds on one clock (the controller's); comparing clocks of different hosts is what made
torch's heartbeats fragile. A job that has not started has no deadline yet.
"""

from __future__ import annotations


def deadline_remaining(started_at: float | None, now: float, active_deadline_seconds: int | None) -> float | None:
    """Seconds left before the deadline (<= 0 once reached); None when there is no deadline to wait for.

    A level-triggered controller uses it to requeue itself exactly when the deadline falls due.
    """
    if started_at is None or active_deadline_seconds is None:
        return None
    return started_at + active_deadline_seconds - now


def deadline_exceeded(started_at: float | None, now: float, active_deadline_seconds: int | None) -> bool:
    """True once `now - started_at` reaches the deadline (as Kubernetes Jobs: at, not after)."""
    remaining = deadline_remaining(started_at, now, active_deadline_seconds)
    return remaining is not None and remaining <= 0
