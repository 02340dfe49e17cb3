"""metrics.advance: what the Prometheus metrics move by, from samples of a level-triggered controller."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from elastic.controller.metrics import FIRST_STEP, RENDEZVOUS, JobSample, Seen, advance
from elastic.controller.metrics_export import ControllerMetrics
from elastic.rendezvous.state import JobState

RUN = "run-1"


def sample(round: int | None = 0, **fields) -> JobSample:
    return JobSample(run_id=RUN, phase="Running", round=round, **fields)


CRASHED = dict(opened_by="WorkerFailure", opened_at=100.0, charge_reasons=("WorkerFailure",), step=30)
SEALED = {**CRASHED, "sealed_at": 102.0}


def walk(samples: list[tuple[JobSample, float]]) -> tuple[int, list[str], list[tuple[str, float]]]:
    """Feed the samples in order; the totals of what the metrics moved by."""
    seen: Seen | None = None
    rounds, charges, recovery = 0, [], []
    for one, now in samples:
        seen, updates = advance(seen, one, now)
        rounds += updates.rounds
        charges += updates.charges
        recovery += updates.recovery
    return rounds, charges, recovery


@pytest.mark.parametrize(
    ("samples", "rounds", "charges", "recovery"),
    [
        pytest.param([(sample(None), 0.0)], 0, [], [], id="a job with no round yet counts nothing"),
        pytest.param([(sample(0), 0.0)] * 3, 1, [], [], id="round 0 seen three times is one round"),
        pytest.param(
            [(sample(0), 0.0), (sample(1, **CRASHED), 100.5), (sample(1, **CRASHED), 100.7)],
            2, ["WorkerFailure"], [], id="one crash seen twice is one charge and one more round",
        ),
        pytest.param(
            [(sample(0), 0.0), (sample(1, **CRASHED), 100.5), (sample(1, **SEALED), 102.1),
             (sample(1, **SEALED), 102.5), (sample(1, **{**SEALED, "step": 40}), 105.0),
             (sample(1, **{**SEALED, "step": 50}), 106.0)],
            2, ["WorkerFailure"], [(RENDEZVOUS, 2.0), (FIRST_STEP, 5.0)],
            id="a recovery is timed once: sealed 2 s after the crash, the first step seen 5 s after it",
        ),
        pytest.param(
            [(sample(3, opened_by="WorkerFailure", opened_at=50.0, sealed_at=51.0,
                     charge_reasons=("WorkerFailure", "MemberLost")), 60.0)],
            4, ["WorkerFailure", "MemberLost"], [(RENDEZVOUS, 1.0)],
            id="a job first seen mid-run counts what etcd holds",
        ),
        pytest.param(
            [(sample(2, charge_reasons=("WorkerFailure",)), 0.0),
             (JobSample(run_id="run-2", phase="Created", round=0), 1.0)],
            4, ["WorkerFailure"], [], id="a resubmitted job (new run id) counts from its own round 0",
        ),
        pytest.param(
            [(sample(0), 0.0), (sample(1, opened_by="ScaleUp", opened_at=10.0, sealed_at=11.5), 12.0)],
            2, [], [(RENDEZVOUS, 1.5)], id="a free scale-up is a round and a rendezvous but no charge",
        ),
    ],
)  # fmt: skip
def test_advance(samples, rounds, charges, recovery) -> None:
    assert walk(samples) == (rounds, charges, recovery)


def test_the_spares_ready_are_a_gauge_of_their_own_and_not_active_workers() -> None:
    metrics = ControllerMetrics()
    status = {"phase": "Running", "replicas": {"desired": 2, "active": 2}, "spares": {"wanted": 1, "ready": 1}}
    metrics.record("default", "spare", RUN, JobState(), status)
    scrape = generate_latest(metrics.registry).decode()
    assert 'elastic_spares_ready{job_name="spare",job_namespace="default"} 1.0' in scrape, scrape
    assert 'elastic_replicas_active{job_name="spare",job_namespace="default"} 2.0' in scrape, scrape
