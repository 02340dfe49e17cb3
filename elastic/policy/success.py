"""When a job has succeeded (docs/design.md §3.6), and which workers must then be stopped.

`AllWorkers` waits for every rank of the last round to exit 0. `Rank0` trusts the chief: as soon as rank 0
exits 0 the job is done, and ranks still running are stopped so that nothing is left behind.
A non-zero exit is not decided here: it is an incident for `exits.classify`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from elastic.spec import SuccessPolicy


@dataclass(frozen=True)
class SuccessOutcome:
    succeeded: bool
    stop_ranks: tuple[int, ...] = ()  # ranks still running that the executor must stop, ascending


def decide_success(policy: SuccessPolicy | str, world: Mapping[int, int | None]) -> SuccessOutcome:
    """`world` maps each rank of the last round to its exit code, None while it still runs."""
    policy = SuccessPolicy(policy)
    if policy is SuccessPolicy.RANK0:
        if world.get(0) != 0:
            return SuccessOutcome(False)
        running = tuple(sorted(rank for rank, code in world.items() if code is None))
        return SuccessOutcome(True, running)
    # An empty world has not succeeded: no round ran to completion.
    return SuccessOutcome(bool(world) and all(code == 0 for code in world.values()))
