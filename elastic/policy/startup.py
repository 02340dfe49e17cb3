"""`startupTimeoutSeconds`: a job whose workers cannot start fails with reason `StartupTimeout`, instead of
sitting Pending forever.

Fail, not reschedule, and only while the job cannot train:
- A worker is *starting* while its pod is Pending (not scheduled, init containers running, its image
  pulling or failing to pull, its config missing). Deleting it and creating another gives the same pod
  spec to the same scheduler and kubelet, which already retry on their own (image pulls back off,
  unschedulable pods are retried on every cluster change): a reschedule adds churn, not a chance.
  Kueue's `waitForPodsReady` evicts and requeues instead, but that gives quota back to a queue; this
  controller has no quota to give back and no queue to wait in.
- An elastic job is meant to run with what it gets. While at least `minReplicas` workers are ready the
  job trains, and a worker still waiting (the cluster has no room for `maxReplicas` yet) is capacity the
  job takes the moment it frees: the `WorkersWaiting` condition says why, and nothing fails.
- With fewer than `minReplicas` ready, no round can seal: the job is stuck. Once a starting worker has
  been starting for the timeout (from its pod's creation, on the controller's clock), the job fails with
  a message naming that worker and what it waits on, e.g. `ImagePullBackOff: ...`.

A pod that ran and then lost its readiness (its node stopped reporting) is not starting: that is a loss,
classified and charged as one when the pod ends, never a StartupTimeout. Local processes start at once
and are never pending.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class StartingWorker(Protocol):
    """What this policy reads of a worker: the fields of `elastic.cluster.WorkerObservation` it needs, as a
    protocol, because policy sits below cluster and never imports it (docs/design.md, Layers)."""

    @property
    def name(self) -> str: ...
    @property
    def alive(self) -> bool: ...
    @property
    def stopping(self) -> bool: ...
    @property
    def ready(self) -> bool: ...
    @property
    def pending(self) -> bool: ...
    @property
    def started_at(self) -> float: ...
    @property
    def waiting(self) -> str | None: ...


def startup_timed_out(
    workers: Iterable[StartingWorker], now: float, timeout_seconds: int, min_replicas: int
) -> str | None:
    """The StartupTimeout message when the job cannot train and a worker has been starting too long; else None."""
    live = [w for w in workers if w.alive and not w.stopping]
    ready = sum(1 for w in live if w.ready and not w.pending)
    if ready >= min_replicas:
        return None
    # (started_at 0: creation time unknown; such a worker is never judged late)
    late = [w for w in live if w.pending and w.started_at > 0 and now - w.started_at >= timeout_seconds]
    if not late:
        return None
    oldest = min(late, key=lambda w: (w.started_at, w.name))
    why = oldest.waiting or "Pending"
    more = f" (and {len(late) - 1} more)" if len(late) > 1 else ""
    return (
        f"worker {oldest.name} has not started after {int(now - oldest.started_at)} s ({why}){more}; "
        f"{ready} of minReplicas {min_replicas} worker(s) ready (spec.startupTimeoutSeconds: {timeout_seconds})"
    )


def startup_due(workers: Iterable[StartingWorker], now: float, timeout_seconds: int, min_replicas: int) -> float | None:
    """Seconds until `startup_timed_out` may first say yes by time alone (None: only a change of the workers
    can make it): when the oldest worker still starting reaches the timeout, while the job cannot train."""
    live = [w for w in workers if w.alive and not w.stopping]
    if sum(1 for w in live if w.ready and not w.pending) >= min_replicas:
        return None
    starting = [w.started_at for w in live if w.pending and w.started_at > 0]
    return max(min(starting) + timeout_seconds - now, 0.0) if starting else None
