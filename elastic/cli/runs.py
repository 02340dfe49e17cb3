"""Runs started with stock `torchrun --rdzv-backend=etcd-v3` and no ElasticJob: `status` and `describe`
show them from their rendezvous keys alone.

Such a run has the keys the agents write (`run`, `round`, `members/`, `budget`, `closed`, on the run's
lease, so they stay for the run's TTL after its last agent) but no `spec` and no `status`: no controller
runs it. Its phase, reason and message come from the rendezvous state through the controller's own
`phase_of`, as the live view derives them, so a run reads the same as a job at the same point.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elastic.controller.status import phase_of, restarts_taken
from elastic.rendezvous.run import JobRun
from elastic.rendezvous.state import JobState
from elastic.store import JobKeys, Store
from elastic.store.keys import job_keys_prefix

# Keys only the agents write: one of them without a `spec` beside it is a run torchrun started.
AGENT_KEYS = ("run", "round", "budget")
STARTED_BY = "torchrun (no ElasticJob submitted: no controller runs it)"


@dataclass(frozen=True)
class RunReport:
    """A run without a spec: its keys and its rendezvous state at one revision."""

    keys: JobKeys
    state: JobState

    @property
    def key(self) -> str:
        return f"{self.keys.namespace}/{self.keys.name}"

    @property
    def status(self) -> dict[str, Any]:
        """The fields of a job's status that the rendezvous state alone determines."""
        phase, reason, message = phase_of(self.state)
        current, budget = self.state.round, self.state.budget
        used, limit = restarts_taken(budget, 0)
        status: dict[str, Any] = {"phase": phase, "reason": reason, "message": message}
        if current is not None:
            status.update(round=current.number, worldSize=current.world_size)
        if budget is not None:
            status.update(restarts={"used": used, "max": limit}, restartsText=f"{used}/{limit}")
        return status


def list_runs(store: Store) -> list[JobKeys]:
    """The runs in etcd that have agents' keys and no spec, by namespace and name."""
    entries, _ = store.get_prefix(job_keys_prefix())
    with_spec: set[tuple[str, str]] = set()
    with_agents: set[tuple[str, str]] = set()
    for entry in entries:
        parts = entry.key[len(job_keys_prefix()) :].split("/")
        if len(parts) != 3:
            continue
        if parts[2] == "spec":
            with_spec.add((parts[0], parts[1]))
        elif parts[2] in AGENT_KEYS:
            with_agents.add((parts[0], parts[1]))
    return [JobKeys(namespace, name) for namespace, name in sorted(with_agents - with_spec)]


def read_run(store: Store, keys: JobKeys) -> RunReport:
    return RunReport(keys, JobRun(store, keys).read())


def find_run(store: Store, keys: JobKeys) -> RunReport | None:
    """The run these keys name if it is one without a spec (else None: no such run, or a submitted job)."""
    entries, _ = store.get_prefix(keys.prefix)
    names = {entry.key[len(keys.prefix) :] for entry in entries}
    if "spec" in names or not names & set(AGENT_KEYS):
        return None
    return read_run(store, keys)


def run_object(run: RunReport) -> dict[str, Any]:
    """The run as `status -o json|yaml` shows a job, with no spec, and an annotation that says why."""
    return {
        "apiVersion": "elastic.dev/v1alpha1",
        "kind": "ElasticJob",
        "metadata": {"name": run.keys.name, "namespace": run.keys.namespace, "uid": run.state.run_id,
                     "annotations": {"elastic.dev/started-by": STARTED_BY}},
        "status": run.status,
    }  # fmt: skip
