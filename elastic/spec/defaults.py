"""Every default of a job's timing and budget, defined once.

The spec model (and so the CRD generated from it), the `etcd-v3` backend's `--rdzv-conf` parser and the
controller's run keys all read their defaults here, so a default cannot say one thing in a spec and another
to an agent. Where two values differ on purpose, both are named here with the reason.
"""

from __future__ import annotations

# A member's etcd lease TTL: how long a silently dead agent still counts as present.
LEASE_SECONDS = 10
# After min nodes joined, how long a round waits without a new joiner before it seals.
LAST_CALL_SECONDS = 2.0
# How long a failed agent waits for the other reports of the same incident before the round ends on the first
# cause it has (docs/design.md §3.16).
SETTLE_SECONDS = 1.0
# The job budget: failure-caused round transitions the job may take (docs/design.md §3.2-3.4).
MAX_RESTARTS = 3
# How long an agent may wait to get into a round, for a job the controller runs (spec.rendezvous).
JOIN_TIMEOUT_SECONDS = 600
# The same wait for an agent started by hand with stock torchrun: torch's launcher passes its own `timeout`
# (900 s unless --rdzv-conf timeout= says otherwise) to every backend, and an agent given no timeout at all
# waits as long, so one started without torch's launcher behaves like one started with it.
TORCHRUN_JOIN_TIMEOUT_SECONDS = 900
# How long a Pending worker may keep a job that cannot train from failing with StartupTimeout.
STARTUP_TIMEOUT_SECONDS = 600
# How long a job that trained, then fell below minReplicas, waits for capacity before it fails (0: forever).
# An hour: spot capacity usually comes back within minutes, and an hour of a stuck job is what an on-call
# engineer notices in time.
CAPACITY_TIMEOUT_SECONDS = 3600
# How long a run's keys outlive its last agent (its job lease): nothing of a finished run stays in etcd.
RUN_TTL_SECONDS = 3600
