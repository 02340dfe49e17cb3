"""The project's error hierarchy, in one place.

Every error says whether retrying can help (kopf's temporary/permanent split): `tenacity` retries only
`TemporaryError`; a `PermanentError` reaches the user with what failed, where, and what to do.
"""

from __future__ import annotations


class ElasticError(Exception):
    """Base of every error this project raises on purpose."""


class TemporaryError(ElasticError):
    """Retrying the same call later may succeed (etcd unavailable, a deadline passed)."""


class PermanentError(ElasticError):
    """Retrying will not help; the message tells the user what to change."""


class StoreUnavailableError(PermanentError):
    """etcd did not answer within the retry bound. Raised instead of a raw gRPC error."""


class StoreUnreachableError(StoreUnavailableError):
    """etcd did not answer within the retry bound (down, paused, partitioned, leaderless): it may come back.
    A command that asked once reports it; a process that runs on (a controller, a live view) waits for etcd
    and says so once (`elastic.store.outage.Outage`)."""


class LeaseLostError(StoreUnavailableError):
    """etcd refused a write under a lease it no longer has (expired or revoked): the keys on it are gone, and
    writing again under the same lease can never succeed (a new lease can)."""


class WatchCompactedError(PermanentError):
    """A watch cannot resume: etcd compacted the revisions it still needed to deliver."""


class NotLeaderError(PermanentError):
    """A controller write was refused: this controller is no longer the elected leader (fenced out)."""
