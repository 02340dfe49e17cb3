"""An etcd outage seen from a process that runs on: one line when etcd stops answering, one when it answers
again, and in between the caller waits and tries again (issue 41).

Why: every call already retries within its bound (`StoreBase.retry_seconds`) and then raises
`StoreUnreachableError`; a command run once reports that and exits, but a controller or a live view that
exited would stop the workers it supervises over a pause etcd recovers from (an etcd paused for 20 s ended
`elastic run`, leaving the job shown `Running` with nothing running). An outage is free by the documented
rules; what happened during it is decided when etcd is back.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable
from typing import TypeVar

from elastic.errors import StoreUnreachableError

T = TypeVar("T")

log = logging.getLogger(__name__)

RETRY_SECONDS = 1.0  # while etcd is away, a loop tries again this often (each try waits its own retry bound)


class Outage:
    """Tracks whether etcd is away for one loop; `say` gets two lines per outage, never one per retry."""

    def __init__(self, what: str, say: Callable[[str], None] | None = None) -> None:
        self.what = what  # who waits: "the controller", "the live view"
        self.say = say or log.warning
        self.since: float | None = None  # wall time the outage began (for the line), None while etcd answers
        self._began: float | None = None  # monotonic, for its length

    @property
    def ongoing(self) -> bool:
        return self.since is not None

    def began(self, err: StoreUnreachableError) -> None:
        if self.since is not None:
            return
        self.since, self._began = time.time(), time.monotonic()
        at = datetime.datetime.fromtimestamp(self.since).strftime("%H:%M:%S")
        self.say(f"etcd is unreachable since {at} ({_first_sentence(err)}); {self.what} waits for it and "
                  "carries on when it answers")

    def call(self, fn: Callable[[], T]) -> T:
        """`fn()`, tried again every RETRY_SECONDS while etcd does not answer (each try within its own bound)."""
        while True:
            try:
                result = fn()
            except StoreUnreachableError as err:
                self.began(err)
                time.sleep(RETRY_SECONDS)
                continue
            self.ended()
            return result

    def ended(self) -> None:
        if self.since is None or self._began is None:
            return
        lasted = time.monotonic() - self._began
        self.since = self._began = None
        self.say(f"etcd answers again after {lasted:.0f} s; {self.what} carries on")


def _first_sentence(err: BaseException) -> str:
    return str(err).split(". ", 1)[0]
