"""The live view's pure parts: the state each revision gives, and how it is drawn (tables of cases)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from elastic.cli.live_state import LiveState, Snapshot, Tick, advance, of_status
from elastic.cli.live_view import duration, event_line, render, rows, status_line, step_text
from elastic.cli.live_watch import by_revision
from elastic.policy.budget import Budget, Charge
from elastic.rendezvous.state import Closed, JobState, Round
from elastic.store import WatchEvent

CHARGE = Charge(0, "WorkerFailure", "exit code 137 (SIGKILL) of worker w-1", 137, "w-1-9-ab", 100.0)
RUNNING = {"phase": "Running", "round": 0, "worldSize": 2, "replicasText": "2/2", "restartsText": "0/3"}


def snap(rnd: Round | None = None, budget: Budget | None = None, closed: Closed | None = None,
         status: dict | None = None, progress: dict | None = None) -> Snapshot:  # fmt: skip
    return Snapshot(JobState(round=rnd, budget=budget, closed=closed), status or {}, progress)


@pytest.mark.parametrize(
    ("snapshot", "phase", "round_", "world", "restarts", "incident"),
    [
        pytest.param(snap(), "Pending", 0, 0, "-", None, id="nothing written yet"),
        pytest.param(snap(Round(0), Budget(3)), "Created", 0, 0, "0/3", None, id="first round gathering"),
        pytest.param(snap(Round(0, True, {"a": 0, "b": 1}), Budget(3), status=RUNNING), "Running", 0, 2, "0/3", None,
                     id="sealed"),
        pytest.param(snap(Round(1, opened_by="WorkerFailure"), Budget(3, 1, (CHARGE,)), status=RUNNING),
                     "Restarting", 1, 0, "1/3", "round 0: exit code 137 (SIGKILL) of worker w-1",
                     id="a re-forming round shows Restarting though the controller's status still says Running"),
        pytest.param(snap(Round(2, True, {"a": 0}), Budget(1, 2, (CHARGE, CHARGE)),
                          Closed("BackoffLimitExceeded", "2 failure(s) > maxRestarts 1")),
                     "Failed", 2, 1, "1/1", "BackoffLimitExceeded: 2 failure(s) > maxRestarts 1",
                     id="a spent budget never reads over its max; the close is the incident"),
    ],
)  # fmt: skip
def test_the_phase_round_and_budget_come_from_the_rendezvous_state(snapshot, phase, round_, world, restarts,
                                                                   incident) -> None:
    state = advance(LiveState("default/j"), snapshot, now=10.0)
    assert (state.phase, state.round, state.world_size, state.restarts, state.incident) == (
        phase, round_, world, restarts, incident)  # fmt: skip


def test_each_milestone_is_one_event_and_steps_alone_are_none() -> None:
    sealed0 = Round(0, True, {"a": 0, "b": 1})
    revisions = [
        snap(Round(0), Budget(3)),
        snap(sealed0, Budget(3), status=RUNNING),
        snap(sealed0, Budget(3), status=RUNNING, progress={"step": 5}),
        snap(sealed0, Budget(3), status=RUNNING, progress={"step": 10}),
        snap(Round(1, opened_by="WorkerFailure"), Budget(3, 1, (CHARGE,)), status=RUNNING, progress={"step": 10}),
        snap(Round(1, True, {"a": 0, "b": 1}), Budget(3, 1, (CHARGE,)), status=RUNNING, progress={"step": 10}),
    ]
    state = LiveState("default/j", started=100.0)
    for now, revision in enumerate(revisions, start=101):
        state = advance(state, revision, float(now), event_line)
    assert [line.split("]")[1].split()[:3] for line in state.events] == [
        ["Created", "round", "0"], ["Running", "round", "0"], ["Restarting", "round", "1"], ["Running", "round", "1"]]
    assert "restarts 1/3  WorkerFailure: round 0 ended (WorkerFailure: exit code 137" in state.events[2]
    assert state.events[2].startswith("[   5.0s]")


@pytest.mark.parametrize(
    ("reports", "rate", "eta", "shown"),
    [
        pytest.param([], None, None, "-", id="no report"),
        pytest.param([(10.0, 5)], None, None, "5", id="one report: no rate yet"),
        pytest.param([(10.0, 5, 100), (12.0, 25, 100)], 10.0, 7.5, "25/100 (10.0 steps/s, ETA 7s)", id="total: ETA"),
        pytest.param([(10.0, 5), (12.0, 25)], 10.0, None, "25 (10.0 steps/s)", id="no total: no ETA"),
        pytest.param([(10.0, 20), (12.0, 30), (15.0, 15), (16.0, 25)], 10.0, None, "25 (10.0 steps/s)",
                     id="steps back after a restart: measured from the resume"),
    ],
)  # fmt: skip
def test_steps_per_second_and_eta(reports, rate, eta, shown) -> None:
    state = LiveState("default/j")
    for at, step, *total in reports:
        report = {"step": step, "at": at, **({"total": total[0]} if total else {})}
        state = advance(state, snap(progress=report), now=at + 0.5)
    assert (state.rate, state.eta, step_text(state)) == (rate, eta, shown)


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (59.9, "59s"), (65, "1m05s"), (7380, "2h03m"), (-3, "0s")])
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text


@pytest.mark.parametrize(
    ("status", "line"),
    [
        pytest.param({}, "Pending    round 0   world 0  replicas -     restarts -", id="empty"),
        pytest.param({**RUNNING, "progress": {"step": 30, "loss": 0.30261}},
                     "Running    round 0   world 2  replicas 2/2   restarts 0/3   step 30    loss 0.3026",
                     id="running"),
        pytest.param({**RUNNING, "phase": "Restarting", "round": 1, "worldSize": 0, "reason": "WorkerFailure",
                      "message": "round 0 ended", "progress": {"step": 30, "total": 120}},
                     "Restarting round 1   world 0  replicas 2/2   restarts 0/3   step 30/120 loss - "
                     "(WorkerFailure: round 0 ended)", id="restarting, with a total and no loss"),
    ],
)  # fmt: skip
def test_status_line(status: dict, line: str) -> None:
    assert status_line(of_status(status)) == line


def test_the_table_says_what_an_operator_looks_for() -> None:
    state = LiveState("default/j", 0.0, "Running", "RoundSealed", "", 1, 2, "2/2", "1/3", 40, 120, 0.25,
                      progress_at=95.0, ticks=(Tick(90.0, 20), Tick(95.0, 40)), incident="round 0: exit code 137",
                      events=("[   1.0s] Running    round 0", "[   9.0s] Restarting round 1"))  # fmt: skip
    assert dict(rows(state, now=100.0)) == {
        "job": "default/j", "phase": "Running (RoundSealed)", "round": "1   world size 2",
        "replicas": "2/2 (active/desired)", "restarts": "1/3 (used/max)", "step": "40/120 (4.0 steps/s, ETA 20s)",
        "loss": "0.2500", "last progress": "5s ago", "last incident": "round 0: exit code 137"}  # fmt: skip
    out = io.StringIO()
    Console(file=out, width=100, color_system=None).print(render(state, now=100.0))
    drawn = out.getvalue()
    assert "last incident  round 0: exit code 137" in drawn and drawn.index("events") < drawn.index("Restarting")


def test_a_transaction_is_one_revision() -> None:
    events = [WatchEvent("put", k, b"", r) for k, r in (("round", 7), ("budget", 7), ("status", 8), ("a", 9))]
    assert [[e.key for e in group] for group in by_revision(events)] == [["round", "budget"], ["status"], ["a"]]
