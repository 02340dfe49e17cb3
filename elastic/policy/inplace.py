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
# A local worker's group broke while its round still holds: a peer vanished. If its own agent lives it ends
# the round within milliseconds (it sees the exit at once); after this long nobody will, the peer's whole
# node is gone, and this agent ends the round instead of waiting for the lost member's lease to run out.
LOST_PEER_GRACE_SECONDS = 0.5


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


@dataclass(frozen=True)
class ReportLostPeer:
    """End the round for a peer that vanished without anyone reporting it (charged, as NodeLost)."""


AgentStep = Keep | Finish | Replace | RestartAll | Rejoin | ReportLostPeer


def next_step(
    exits: Mapping[int, int | None], capable: frozenset[int], change_pending: bool, broken_for: float | None = None
) -> AgentStep:
    """`exits`: local rank -> exit code (None while running). `capable`: ranks that follow rounds themselves.
    `broken_for`: seconds since a local worker said its group broke in the current round (None: none did)."""
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
    if broken_for is not None and broken_for >= LOST_PEER_GRACE_SECONDS:
        return ReportLostPeer()
    return Keep()
