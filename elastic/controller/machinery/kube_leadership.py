"""The Kubernetes controller's right to act: the Lease says who leads, the etcd election fences its writes.

Why both. The Lease (lease_election.py) is how Kubernetes replicas agree on one leader, with client-go's semantics,
but no Lease can stop a write that a deposed leader already has on its way: a step that stalled (a GC pause,
a frozen VM, a slow call) and resumes after another replica took over. etcd can: the Lease holder also
campaigns in the local controllers' election (etcd_election.py) and writes to etcd only through its
`FencedStore`, whose every transaction compares the leader key's mod revision (its epoch). One mechanism
for both backends, not a second one: only a Lease holder campaigns, so the etcd key changes hands after the
Lease did; the deposed leader's key is revoked when it notices the loss (or lapses with its etcd lease
when the whole process froze), and the next leader's campaign re-creates it at a revision the old epoch
never matches again. A deposed leader's etcd writes then fail in etcd itself (`NotLeaderError`).

Acting therefore needs both: the Lease acting *and* the epoch (`lead()`), re-checked after the campaign
in case the Lease was lost meanwhile. Pod and status writes go to the API server, which cannot compare an
etcd key: `check()` runs right before each one is sent (the Lease still acting, the fence still holding:
one etcd read), which leaves only the instant between that check and the request.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

from elastic.cluster.base import WorkerLaunch, WorkerObservation
from elastic.cluster.kubernetes import KubernetesWorkers
from elastic.controller.machinery.etcd_election import Election
from elastic.controller.machinery.lease_election import LeaderElector
from elastic.errors import ElasticError, NotLeaderError
from elastic.store.fenced import FencedStore

log = logging.getLogger(__name__)

EXIT_LOST_LEADERSHIP = 1


def exit_on_loss(why: str) -> None:
    """client-go's OnStoppedLeading in practice: a deposed controller exits; its pod restarts and follows.

    `os._exit`, because the loss is noticed on the renew thread and a stalled main thread must not act on.
    """
    print(f"error: controller lost leadership ({why}); exiting", file=sys.stderr, flush=True)
    os._exit(EXIT_LOST_LEADERSHIP)


class KubeLeadership:
    """`lead()` before each pass: the fenced store while this replica holds the Lease and the epoch."""

    def __init__(
        self, elector: LeaderElector, election: Election, on_lost: Callable[[str], None] | None = None
    ) -> None:
        self.elector = elector
        self.election = election
        self._on_lost = on_lost
        elector.on_stopped_leading = self._lost  # the elector's loss is this replica's loss: both go

    @property
    def acting(self) -> bool:
        return self.elector.acting

    def start(self) -> KubeLeadership:
        self.elector.start()
        return self

    def lead(self) -> FencedStore | None:
        """The fenced store while this replica holds the Lease and the epoch; None (an epoch without the
        Lease given up) otherwise."""
        if not self.elector.acting:
            if self.election.epoch is not None:
                self.election.resign()
            return None
        fenced = self.election.lead()
        if fenced is not None and not self.elector.acting:  # the Lease went while we campaigned
            self.election.resign()
            return None
        return fenced

    def check(self, fenced: FencedStore, what: str) -> None:
        """Raise `NotLeaderError` unless this replica still acts on `fenced`'s epoch (before an API write)."""
        if not self.elector.acting:
            identity = self.elector.identity
            raise NotLeaderError(f"controller {identity} no longer holds the Lease, so {what} was not sent")
        if not fenced.holds():
            raise NotLeaderError(
                f"controller {fenced.holder} no longer holds the etcd epoch {fenced.fence.revision}, "
                f"so {what} was not sent: another controller acts now"
            )

    def _lost(self, why: str) -> None:
        """On the renew thread, at the loss of the Lease: give the etcd key up, then tell `on_lost`.

        Revoking by lease id touches no state of the `Election` object (the main thread owns that; it steps
        down on its next `lead()`): the successor then need not wait for the key to lapse.
        """
        try:
            record = self.election.read()
            if record is not None and record.holder == self.election.holder:
                self.election.store.revoke(record.lease)
        except ElasticError as err:  # the key then lapses with its etcd lease, within its TTL
            log.warning("could not give the etcd leader key up: %s", err)
        if self._on_lost is not None:
            self._on_lost(why)

    def close(self) -> None:
        """A clean shutdown: stop renewing, give the epoch up, then release the Lease for a quick handover."""
        self.elector.stop()
        self.election.resign()
        self.elector.release()


class FencedWorkers:
    """A job's pods, written only after `check` passed: the API server knows nothing of the etcd epoch."""

    def __init__(self, workers: KubernetesWorkers, check: Callable[[str], None]) -> None:
        self.workers = workers
        self._check = check

    def start(self, launch: WorkerLaunch) -> None:
        self._check(f"creating pod {launch.name}")
        self.workers.start(launch)

    def stop(self, name: str) -> None:
        self._check(f"deleting pod {name}")
        self.workers.stop(name)

    def forget(self, name: str) -> None:
        self._check(f"deleting pod {name}")
        self.workers.forget(name)

    def finish(self) -> None:
        self._check(f"deleting the pods of {self.workers.job.key}")
        self.workers.finish()

    def observe(self) -> list[WorkerObservation]:
        return self.workers.observe()

    def close(self) -> None:
        self.workers.close()
