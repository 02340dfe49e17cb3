"""Replica bounds and when a round may seal (docs/design.md §3.7).

Sealing at maxReplicas at once saves every full-size (re)start the `lastCallSeconds` wait; sealing below
max only after a quiet `lastCallSeconds` gives stragglers of the same restart a chance to make the round,
so a recovery does not immediately trigger a second, scale-up round. After a failure the stragglers are
known by name (the members heard from during the incident): once they are all back, the wait is over.
"""

from __future__ import annotations


def clamp_replicas(desired: int | None, min_replicas: int, max_replicas: int) -> int:
    """The size the controller aims for: `desired` clamped into [min, max]; unset means max.

    Out-of-range is clamped rather than rejected so that an autoscaler or a hand edit can never make an
    otherwise valid job invalid.
    """
    if not 1 <= min_replicas <= max_replicas:
        raise ValueError(f"bounds must satisfy 1 <= min <= max, got min={min_replicas}, max={max_replicas}")
    if desired is None:
        return max_replicas
    return max(min_replicas, min(desired, max_replicas))


def round_can_seal(
    members: int,
    min_replicas: int,
    max_replicas: int,
    seconds_since_last_join: float,
    last_call_seconds: float,
    stragglers: int | None = None,
) -> bool:
    """Whether a round with `members` joined may be sealed now.

    `stragglers`: members known to be restarting into this round that have not joined yet; None when
    nobody is known (a first round, a voluntary change), so that only the last call can end the wait.
    A member lost for good is never known to be restarting, which is why a node loss need not wait.
    """
    if members >= max_replicas:
        return True
    if members < min_replicas:
        return False
    return stragglers == 0 or seconds_since_last_join >= last_call_seconds
