"""Which change of a job's keys queues it, and when (pure): what keeps the controllers from reading every job on a
timer. The watch itself runs in the controllers' end-to-end tests."""

from __future__ import annotations

import pytest

from elastic.controller.machinery.job_events import DECIDING_KEYS, PROGRESS_SECONDS, queue_entry


@pytest.mark.parametrize(
    ("key", "deciding", "expected"),
    [
        ("ns/j/round", DECIDING_KEYS, (("ns", "j"), 0.0)),
        ("ns/j/members/agent-1-ab", DECIDING_KEYS, (("ns", "j"), 0.0)),
        ("ns/j/incidents/4/agent-1-ab", DECIDING_KEYS, (("ns", "j"), 0.0)),
        ("ns/j/closed", DECIDING_KEYS, (("ns", "j"), 0.0)),
        ("ns/j/progress", DECIDING_KEYS, (("ns", "j"), PROGRESS_SECONDS)),
        ("ns/j/store/4/workers/0", DECIDING_KEYS, None),
        ("ns/j/status", DECIDING_KEYS, None),
        ("ns/j/workers/j-ab12", DECIDING_KEYS, None),
        ("ns/j/alive/4/agent-1-ab", DECIDING_KEYS, None),
        ("ns/j/spec", DECIDING_KEYS, None),
        ("ns/j/spec", DECIDING_KEYS | {"spec"}, (("ns", "j"), 0.0)),
        ("ns/j", DECIDING_KEYS, None),
        ("//round", DECIDING_KEYS, None),
    ],
    ids=["the round: at once", "a member", "an incident report", "the job closed", "progress: within 5 s",
         "the agents' torch store: never", "the controller's own status: never", "its worker records: never",
         "incident answers: never", "the spec, where the controller writes it (Kubernetes' mirror): never",
         "the spec, where users write it (elastic submit, scale): at once", "not a key of a job", "no job name"],
)
def test_queue_entry(key: str, deciding: frozenset[str], expected) -> None:
    assert queue_entry(key, deciding) == expected
