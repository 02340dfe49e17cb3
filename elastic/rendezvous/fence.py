"""A worker's fencing token: the round its agent joined, so that a worker of a round that has ended (an
orphan whose agent died, a worker not yet stopped) cannot commit what the next round will read.

The agent's handler writes it into the agent's environment at every rendezvous, before torch starts the
round's workers, which inherit it (stock torchrun included: the handler runs inside its agent). A worker
reads it with `RoundFence.from_env()`; `elastic.train.checkpoint.publish` checks it against etcd right before
the atomic rename that publishes a checkpoint.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

from elastic.store import JobKeys

FENCE_ENV = "ELASTIC_FENCE"


@dataclass(frozen=True)
class RoundFence:
    endpoints: str
    job: JobKeys
    run_id: str
    round: int

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RoundFence | None:
        """The fence an etcd-v3 agent gave this worker, or None under any other launcher."""
        value = (os.environ if environ is None else environ).get(FENCE_ENV)
        if not value:
            return None
        data = json.loads(value)
        return cls(str(data["endpoints"]), JobKeys.parse(str(data["job"])), str(data["run"]), int(data["round"]))

    def env(self) -> dict[str, str]:
        job = f"{self.job.namespace}/{self.job.name}"
        return {FENCE_ENV: json.dumps({"endpoints": self.endpoints, "job": job, "run": self.run_id,
                                       "round": self.round})}


def fence_holds(fence: RoundFence, run_id: str | None, round_number: int | None, sealed: bool) -> bool:
    """Whether a worker holding `fence` may still publish: its run is the job's run (not a re-created job's)
    and its round is the job's current sealed round."""
    return run_id == fence.run_id and round_number == fence.round and sealed
