"""A worker's view of its job's rounds: which sealed round it belongs to, and when that round is over.

The agent's member is what the round protocol ranks; its workers follow: the worker's global rank is its
agent's rank in the round x the workers per agent + its local rank (every agent runs as many workers, as
torchrun's homogeneous case does). Pure functions of `JobState`, plus a follower that keeps a watched view.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from elastic.rendezvous.agent_store import EtcdAgentStore
from elastic.rendezvous.run import JobRun
from elastic.rendezvous.state import JobState
from elastic.rendezvous.view import JobView
from elastic.store import GatewayStore
from elastic.train.context import WorkerContext


@dataclass(frozen=True)
class Assignment:
    round: int
    rank: int
    world_size: int


class JobClosedError(RuntimeError):
    """The job ended for every agent while this worker waited for a round: its agent stops it."""


def assignment(state: JobState, context: WorkerContext, after: int | None) -> Assignment | None:
    """This worker's place in the current sealed round, if its member is in it and it is newer than `after`."""
    current = state.round
    if current is None or not current.sealed or context.member not in current.members:
        return None
    if after is not None and current.number <= after:
        return None
    nproc = context.local_world_size
    return Assignment(current.number, current.members[context.member] * nproc + context.local_rank,
                      current.world_size * nproc)


def round_over(state: JobState, number: int) -> bool:
    """The round a worker trains in is no longer the job's current sealed round (or the job closed)."""
    current = state.round
    return state.closed is not None or current is None or current.number != number or not current.sealed


class RoundFollower:
    """The job's keys, kept current by a watch (no etcd request per step), and the store for each round."""

    def __init__(self, context: WorkerContext) -> None:
        self.context = context
        self.store = GatewayStore(context.endpoints, auth=context.auth, retry_seconds=15)
        # A member's view: the job's keys but the roster, with its agent's bucket of the ranks (§3.20).
        self.view = JobView(JobRun(self.store, context.job), member=context.member)

    def state(self) -> JobState:
        return self.view.state()

    def wait_for_assignment(self, after: int | None, timeout: float) -> Assignment:
        deadline = time.monotonic() + timeout
        while True:
            seen = self.view.revision
            state = self.view.state()
            found = assignment(state, self.context, after)
            if found is not None:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if state.closed is not None:
                    raise JobClosedError(f"job closed: {state.closed.reason}: {state.closed.message}")
                raise TimeoutError(f"no sealed round after {after} included member {self.context.member} "
                                   f"within {timeout:.0f} s")
            self.view.wait_for_change(seen, timeout=min(remaining, 1.0))

    def group_store(self, number: int) -> EtcdAgentStore:
        """Where the workers of round `number` exchange addresses: under the round's store prefix, which
        ending the round deletes; the waits give up as soon as the round is over, not at a timeout."""
        prefix = self.view.run.keys.store(number) + "workers/"
        return EtcdAgentStore(self.store, prefix, None, self.view,
                              still_valid=lambda: not round_over(self.view.state(), number))

    def close(self) -> None:
        self.view.close()
        self.store.close()
