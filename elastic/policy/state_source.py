"""Which member's state a new process group adopts, and who must receive it (pure).

After a membership change every rank reports (committed step, whether it holds the job's state). A survivor
holds it; a replacement or newcomer does not (it was just started). The source is the holder with the
highest committed step (lowest rank on a tie), so a step that some survivors committed before the fault
and others did not is kept, never lost and never applied twice: the laggards receive it. When nobody holds
state (the job's first round), the newest checkpoint a process loaded wins the same way, and every other
rank receives it, as DDP broadcasts rank 0's parameters at start.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Report:
    step: int
    holds_state: bool


@dataclass(frozen=True)
class TransferPlan:
    source: int
    receivers: tuple[int, ...]

    def broadcast(self, world_size: int) -> bool:
        """Everyone but the source receives: one broadcast beats world_size - 1 sends."""
        return len(self.receivers) == world_size - 1 and world_size > 1


def transfer_plan(reports: list[Report]) -> TransferPlan:
    source = max(range(len(reports)), key=lambda r: (reports[r].holds_state, reports[r].step, -r))
    best = reports[source]
    receivers = tuple(
        r for r, report in enumerate(reports)
        if r != source and not (report.holds_state and best.holds_state and report.step == best.step)
    )
    return TransferPlan(source, receivers)
