"""Workers the platform runs: compose's `--scale`, a batch system, `elastic-agent`s started by hand.

The controller (`elastic controller --backend external`) runs the job's spec, budget, status and events,
but it neither starts nor stops a worker: it sees each agent through the member key the agent holds on
its own lease, and a lost agent is lost to the round through that lease, as under stock torchrun. Such
agents join the run named after the job (`--rdzv-id=<metadata.name> --rdzv-conf job=<namespace>/<name>`):
the controller creates that run with the spec's budget, so every agent charges the same one.
"""

from __future__ import annotations

from elastic.cluster.base import WorkerLaunch, WorkerObservation, WorkerStartError
from elastic.rendezvous.run import JobRun
from elastic.rendezvous.state import JobState
from elastic.store import JobKeys, Store


def agents_in(state: JobState) -> list[WorkerObservation]:
    """Every agent holding a member key, less those a sealed round left behind: a lost agent's key stays until
    its lease runs out (seconds), but its round ended without it, and it is not counted. Pure: the controller
    derives them from the state it has read anyway."""
    current = state.round
    return [WorkerObservation(m.id, alive=True, started_at=m.joined_at) for m in state.members.values()
            if current is None or not current.sealed or m.id in current.members or m.target > current.number]


class ExternalAgents:
    """The job's agents as their member keys show them; starting or stopping one is the platform's job."""

    def __init__(self, store: Store, keys: JobKeys) -> None:
        self.store = store
        self.keys = keys

    def observe(self) -> list[WorkerObservation]:
        return agents_in(JobRun(self.store, self.keys).read())

    def start(self, launch: WorkerLaunch) -> None:
        raise WorkerStartError(f"worker {launch.name}: the platform starts this job's workers, not the controller "
                               "(--backend external)")

    def stop(self, name: str) -> None:
        """Nothing to do: a closed job's agents read `closed` and exit on their own."""

    def forget(self, name: str) -> None:
        """Nothing to do: an agent's member key goes with its lease."""

    def close(self) -> None:
        """Nothing held."""
