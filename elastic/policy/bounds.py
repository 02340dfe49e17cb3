"""Replica bounds and when a round may seal (DESIGN §3.7).

Sealing at maxReplicas at once saves every full-size (re)start the `lastCallSeconds` wait; sealing below
max only after a quiet `lastCallSeconds` gives stragglers of the same restart a chance to make the round,
so a recovery does not immediately trigger a second, scale-up round.
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
) -> bool:
    """Whether a round with `members` joined may be sealed now."""
    if members >= max_replicas:
        return True
    return members >= min_replicas and seconds_since_last_join >= last_call_seconds
