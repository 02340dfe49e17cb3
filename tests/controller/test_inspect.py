"""What the operator's commands derive from a job's records: pure, no etcd."""

from __future__ import annotations

import pytest

from elastic.controller.inspect import root_cause_member, timeline, worker_of
from elastic.controller.reconcile import Observed
from elastic.controller.status import job_status, timestamp
from elastic.policy.budget import Budget, Charge
from elastic.rendezvous.state import Closed, JobState, Round
from elastic.spec import parse_job

JOB = parse_job({"apiVersion": "elastic.dev/v1alpha1", "kind": "ElasticJob", "metadata": {"name": "j"},
                 "spec": {"minReplicas": 1, "maxReplicas": 2, "worker": {"command": ["python", "t.py"]},
                          "failurePolicy": {"maxRestarts": 3}}})  # fmt: skip
CHARGES = tuple(Charge(r, "WorkerFailure", f"exit code 2 of worker j-ab12-{r}-cc", 2, f"j-ab12-{r}-cc", 100.0 + r)
                for r in range(4))  # fmt: skip
SPENT = JobState(run_id="r", round=Round(4), budget=Budget(3, 4, CHARGES),
                 closed=Closed("BackoffLimitExceeded", "restart budget spent: 4 failure(s) > maxRestarts 3", 105.0))


def test_a_spent_budget_reads_max_over_max_never_more() -> None:
    status = job_status(Observed(JOB, SPENT, (), now=106.0), None, None)
    assert status["restartsText"] == "3/3" and status["restarts"] == {"used": 3, "max": 3}
    assert "4 failure(s)" in status["message"], "the message still counts the failure that spent it"


@pytest.mark.parametrize(("member", "workers", "expected"), [
    pytest.param("j-ab12-77-cc", ["j-ab12", "j-cd34"], "j-ab12", id="a member id names its worker"),
    pytest.param("j-ab12", ["j-ab12"], "j-ab12", id="a worker name is itself"),
    pytest.param("k-0000-1-aa", ["j-ab12"], None, id="a member of no known worker"),
    pytest.param(None, ["j-ab12"], None, id="no member"),
])  # fmt: skip
def test_worker_of(member, workers, expected) -> None:
    assert worker_of(member, workers) == expected


@pytest.mark.parametrize(("closed", "expected"), [
    pytest.param(Closed("FailJobRule", "permanent failure", 1.0, "j-ab12-9-aa"), "j-ab12-9-aa",
                 id="a FailJob rule names its member"),
    pytest.param(Closed("BackoffLimitExceeded", "spent", 1.0), "j-ab12-3-cc", id="a spent budget: its last charge"),
    pytest.param(Closed("Deleted", "deleted by the user", 1.0), None, id="a delete is no worker's failure"),
    pytest.param(None, None, id="a running job has no root cause"),
])  # fmt: skip
def test_root_cause_member(closed, expected) -> None:
    assert root_cause_member(JobState(budget=Budget(3, 4, CHARGES), closed=closed)) == expected


def test_the_timeline_orders_conditions_and_charges_by_time() -> None:
    status = job_status(Observed(JOB, SPENT, (), started_at=99.0, now=106.0), None, None)
    events = timeline(status, CHARGES, timestamp)
    assert [e.reason for e in events] == ["Started", *["WorkerFailure"] * 4, "BackoffLimitExceeded"]
    assert [e.at for e in events] == sorted(e.at for e in events)
    assert events[-1].kind == "Warning" and "round 3 ended" in events[-2].message
