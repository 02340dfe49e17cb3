"""How the live view draws a job (pure): a table that `rich` redraws in place on a terminal, the last
events under it, and the plain line of each change for logs (no terminal, or `--no-tty`).

Nothing here reads etcd or a clock: the state and `now` come in, text or a renderable goes out.
"""

from __future__ import annotations

import math

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from elastic.cli.live_state import LiveState

PHASE_STYLES = {"Running": "green", "Succeeded": "bold green", "Restarting": "yellow", "Failed": "bold red"}


def duration(seconds: float) -> str:
    """7s, 1m05s, 2h03m: short enough for a table cell."""
    whole = max(int(seconds), 0)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def step_text(state: LiveState) -> str:
    """`40/120 (12.5 steps/s, ETA 6s)`; what is unknown is left out (no total: no ETA)."""
    if state.step is None:
        return "-"
    text = f"{state.step}/{state.total}" if state.total is not None else str(state.step)
    rate, eta = state.rate, state.eta
    extra = [f"{rate:.1f} steps/s"] if rate is not None else []
    extra += [f"ETA {duration(eta)}"] if eta is not None else []
    return f"{text} ({', '.join(extra)})" if extra else text


def loss_text(loss: float | None) -> str:
    return "-" if loss is None or not math.isfinite(loss) else f"{loss:.4f}"


def status_line(state: LiveState, elapsed: float | None = None, job: str | None = None) -> str:
    """One line per change (logs, `elastic controller`, the last line of `elastic run`)."""
    parts = [f"[{elapsed:6.1f}s]" if elapsed is not None else "", job or ""]
    parts.append(f"{state.phase:<10}")
    parts.append(f"round {state.round:<3} world {state.world_size:<2}")
    parts.append(f"replicas {state.replicas:<5} restarts {state.restarts:<5}")
    if state.step is not None:
        step = f"{state.step}/{state.total}" if state.total is not None else str(state.step)
        parts.append(f"step {step:<5} loss {loss_text(state.loss)}")
    if state.phase in ("Restarting", "Succeeded", "Failed"):
        parts.append(f"({state.reason}: {state.message})")
    return " ".join(p for p in parts if p).rstrip()


def event_line(state: LiveState, now: float) -> str:
    """A line of the scrolling event list: the time since the view began, the milestone, and why."""
    line = (f"[{now - state.started:6.1f}s] {state.phase:<10} round {state.round:<3} world {state.world_size:<2} "
            f"restarts {state.restarts}")  # fmt: skip
    return f"{line}  {state.reason}: {state.message}" if state.phase in ("Restarting", "Succeeded", "Failed") else line


def rows(state: LiveState, now: float) -> list[tuple[str, str]]:
    """The table's rows: what an operator looks at while a job runs."""
    since = "-" if state.progress_at is None else f"{duration(now - state.progress_at)} ago"
    return [
        ("job", state.job),
        ("phase", f"{state.phase} ({state.reason})" if state.reason else state.phase),
        ("round", f"{state.round}   world size {state.world_size}"),
        ("replicas", f"{state.replicas} (active/desired)"),
        ("restarts", f"{state.restarts} (used/max)"),
        ("step", step_text(state)),
        ("loss", loss_text(state.loss)),
        ("last progress", since),
        ("last incident", state.incident or "-"),
    ]


def render(state: LiveState, now: float) -> RenderableType:
    """The table, then the last events (round changes, restarts, the end), newest last."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    for name, value in rows(state, now):
        table.add_row(name, Text(value, style=PHASE_STYLES.get(state.phase, "")) if name == "phase" else value)
    events = [Text(line, no_wrap=True, overflow="ellipsis") for line in state.events] or [Text("  (none yet)")]
    return Group(table, Text(""), Text("events", style="bold"), *events)
