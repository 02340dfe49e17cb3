"""What an in-place agent does with its local workers at each turn of its loop (pure).

The agent keeps survivors running across membership changes when they follow rounds themselves (they use
`elastic.train.Session`, which says so); a stock script cannot, so its workers are restarted together on
any change, as torchrun would (only faster: each is a fork of a warm process).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# A worker that left a collective its peers will never finish (its round ended under it) exits with this
# code; its agent starts it again at once, for free: it did nothing wrong, and its state is on a peer.
ABANDONED_EXIT = 86
# A worker that stopped making progress outside any collective (its own code hangs) exits with this code:
# a failure like any other, charged to the budget once for the incident.
HUNG_EXIT = 87


@dataclass(frozen=True)
class Keep:
    """Nothing happened that needs the agent."""


@dataclass(frozen=True)
class Finish:
    """Every local worker exited 0."""


@dataclass(frozen=True)
class Replace:
    """Start these local ranks again and re-join; `failure` is the exit code to report (None: free)."""

    ranks: tuple[int, ...]
    failure: int | None


@dataclass(frozen=True)
class RestartAll:
    """Stop every local worker, re-join, start them all (stock scripts); `failure` as for Replace."""

    failure: int | None


@dataclass(frozen=True)
class Rejoin:
    """The round ended elsewhere: join the next one, keeping the workers (or restarting all of them)."""

    restart_all: bool


AgentStep = Keep | Finish | Replace | RestartAll | Rejoin


def next_step(exits: Mapping[int, int | None], capable: frozenset[int], change_pending: bool) -> AgentStep:
    """`exits`: local rank -> exit code (None while running). `capable`: ranks that follow rounds themselves."""
    if exits and all(code == 0 for code in exits.values()):
        return Finish()
    ended = {rank: code for rank, code in exits.items() if code not in (None, 0)}
    failures = sorted(rank for rank, code in ended.items() if code != ABANDONED_EXIT)
    in_place = all(rank in capable for rank, code in exits.items() if code != 0)
    if ended:
        failure = ended[failures[0]] if failures else None
        if not in_place and failures:
            return RestartAll(failure)
        return Replace(tuple(sorted(ended)), failure)
    if change_pending:
        return Rejoin(restart_all=not all(rank in capable for rank, code in exits.items() if code is None))
    return Keep()
