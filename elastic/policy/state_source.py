"""Which member's state a new process group adopts, and who must receive it (pure).

After a membership change every rank reports (committed step, whether it holds the job's state). A survivor
holds it; a replacement or newcomer does not (it was just started). The source is the holder with the
highest committed step (lowest rank on a tie), so a step that some survivors committed before the fault
and others did not is kept, never lost and never applied twice: the laggards receive it. When nobody holds
state (the job's first round), the newest checkpoint a process loaded wins the same way, and every other
rank receives it, as DDP broadcasts rank 0's parameters at start. With HSDP the state is one shard per
shard index (`elastic.policy.shard_layout`), and each shard has its own source among its holders.
"""

from __future__ import annotations

from dataclasses import dataclass


class NoSource(ValueError):
    """No live rank holds a shard of the job's state at the step the others hold: memory cannot heal it."""


@dataclass(frozen=True)
class Report:
    step: int
    holds_state: bool
    shard: int = 0  # with HSDP, the shard of the state this rank holds (without, the state is one shard: 0)


@dataclass(frozen=True)
class TransferPlan:
    source: int
    receivers: tuple[int, ...]

    def broadcast(self, world_size: int) -> bool:
        """Everyone but the source receives: one broadcast beats world_size - 1 sends."""
        return len(self.receivers) == world_size - 1 and world_size > 1


def transfer_plans(reports: list[Report], placed: list[int] | None = None) -> list[TransferPlan]:
    """One plan per shard of the state, in shard order: `placed[r]` is the shard rank `r` trains next
    (default: every rank on shard 0, the whole state). A shard's source is the rank holding it at the newest
    step (lowest rank on a tie); it sends to the ranks placed on that shard that do not hold it at that step.
    When nobody holds state (the first round), each shard's source is the newest checkpoint among the ranks
    placed on it, and every other rank there receives.

    Raises `NoSource` when a shard has no holder, or the shards' newest holders are at different steps (a
    step applied to one shard and not to another): memory cannot give every rank the same step."""
    placed = placed if placed is not None else [0] * len(reports)
    anyone_holds = any(report.holds_state for report in reports)
    plans = []
    for shard in sorted(set(placed)):
        if anyone_holds:
            candidates = [r for r, report in enumerate(reports) if report.holds_state and report.shard == shard]
        else:
            candidates = [r for r, on in enumerate(placed) if on == shard]
        if not candidates:
            raise NoSource(f"no live rank holds shard {shard} of the state")
        source = max(candidates, key=lambda r: (reports[r].step, -r))
        best = reports[source]
        receivers = tuple(
            r for r, on in enumerate(placed)
            if on == shard and r != source
            and not (best.holds_state and reports[r].holds_state and reports[r].shard == shard
                     and reports[r].step == best.step)
        )
        plans.append(TransferPlan(source, receivers))
    steps = {reports[plan.source].step for plan in plans}
    if anyone_holds and len(steps) > 1:
        raise NoSource(f"the shards' newest holders are at steps {sorted(steps)}: no live rank holds every shard "
                       "at one step")
    return plans
