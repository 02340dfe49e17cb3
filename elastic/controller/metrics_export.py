"""The controller's Prometheus metrics (`--metrics-port`): applies what metrics.advance decides.

Labels are `job_namespace`, `job_name`, `reason` and `phase` only: never a worker or member name, which
change on every restart and would make a series per incident. Not `job` or `namespace`: Prometheus sets
those itself on every scraped sample (the scrape job; on Kubernetes the target's namespace), so a default
scrape would rename ours to `exported_job`/`exported_namespace` (Kubeflow's training operator says
`job_namespace` for the same reason). These names are part of the interface: dashboards and alerts use them.

Counters are this process's: a controller started later counts, on first sight of a job, what etcd holds
of it (its rounds and charges so far). A job's counters exist at 0 from its first step (each charge reason
the rendezvous knows), so that `increase()` and alerts see the first charge as a change, not as a new series.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from elastic.controller.metrics import FIRST_STEP, RENDEZVOUS, Seen, advance, sample_of
from elastic.controller.status import CONDITION_TYPES
from elastic.policy.incident import RoundEnd
from elastic.rendezvous.state import JobState

JOB = ("job_namespace", "job_name")
# the series of every job from its start; others on first use
CHARGE_REASONS = (RoundEnd.WORKER_FAILURE.value, RoundEnd.MEMBER_LOST.value)
# A recovery takes seconds (a re-rendezvous with lastCallSeconds) to minutes (pods scheduled anew).
RECOVERY_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, float("inf"))


class ControllerMetrics:
    """One registry per controller process; `record` is fed by every JobController step."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.jobs = Gauge("elastic_jobs", "Jobs this controller has seen, by their last phase", ["phase"], registry=r)
        self.charges = Counter(
            "elastic_restarts_charged", "Charges of a job's restart budget (failurePolicy.maxRestarts), one per "
            "incident, by its reason (WorkerFailure, MemberLost, ...)", [*JOB, "reason"], registry=r,
        )  # fmt: skip
        self.rounds = Counter(
            "elastic_rounds", "Rendezvous rounds opened (the first one included); every membership change, "
            "charged or free, opens one", JOB, registry=r,
        )  # fmt: skip
        self.recovery = Histogram(
            "elastic_recovery_duration_seconds", "Seconds from the end of a round (the incident or scale "
            "change that opened the next one, etcd's opened_at) to: phase=rendezvous, the next round sealed "
            "(etcd's sealed_at); phase=first_step, the first change of rank 0's reported step after the seal, "
            "as the controller saw it (within its period and the worker's report interval)",
            ["phase"], buckets=RECOVERY_BUCKETS, registry=r,
        )  # fmt: skip
        self.budget_left = Gauge(
            "elastic_restart_budget_remaining", "Restarts a job may still take (maxRestarts - used)", JOB, registry=r
        )
        self.members = Gauge("elastic_members", "Agents holding a member lease in etcd", JOB, registry=r)
        self.world_size = Gauge("elastic_world_size", "Members of the current sealed round (0 while forming)", JOB,
                                registry=r)  # fmt: skip
        self.replicas_desired = Gauge("elastic_replicas_desired", "Workers wanted (replicas, clamped)", JOB, registry=r)
        self.replicas_active = Gauge("elastic_replicas_active", "Workers running (ready)", JOB, registry=r)
        self.spares_ready = Gauge("elastic_spares_ready", "Warm spares ready beyond the desired workers "
                                  "(spec.spares; not counted as active)", JOB, registry=r)  # fmt: skip
        for phase in (RENDEZVOUS, FIRST_STEP):  # both series exist from the start, empty
            self.recovery.labels(phase=phase)
        for phase in CONDITION_TYPES:
            self.jobs.labels(phase=phase)
        self._seen: dict[str, Seen] = {}
        self._phases: dict[str, str] = {}

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """GET /metrics on `port`, from a daemon thread (it ends with the process)."""
        start_http_server(port, addr=addr, registry=self.registry)

    def record(self, namespace: str, name: str, run_id: str, state: JobState, status: dict[str, Any]) -> None:
        key = f"{namespace}/{name}"
        sample = sample_of(run_id, state, status)
        self._seen[key], updates = advance(self._seen.get(key), sample, time.time())
        labels = dict(zip(JOB, (namespace, name), strict=True))
        self.rounds.labels(**labels).inc(updates.rounds)  # 0 too: the series exists from the job's start
        for reason in CHARGE_REASONS:
            self.charges.labels(**labels, reason=reason)
        for reason in updates.charges:
            self.charges.labels(**labels, reason=reason).inc()
        for phase, seconds in updates.recovery:
            self.recovery.labels(phase=phase).observe(seconds)
        self.budget_left.labels(**labels).set(max(0, sample.restarts_max - sample.restarts_used))
        self.members.labels(**labels).set(sample.members)
        self.world_size.labels(**labels).set(sample.world_size)
        self.replicas_desired.labels(**labels).set(sample.desired)
        self.replicas_active.labels(**labels).set(sample.active)
        self.spares_ready.labels(**labels).set(sample.spares)
        if sample.phase:
            self._phases[key] = sample.phase
            for phase in CONDITION_TYPES:
                self.jobs.labels(phase=phase).set(sum(1 for p in self._phases.values() if p == phase))
