"""A worker's place in a round (pure, from `JobState`) and the agent-to-worker environment contract."""

from __future__ import annotations

import pytest

from elastic.rendezvous.state import Closed, JobState, Round
from elastic.store import EtcdAuth, JobKeys
from elastic.train.context import Marker, WorkerContext
from elastic.train.rounds import Assignment, assignment, round_over

CONTEXT = WorkerContext("http://127.0.0.1:2379", JobKeys("default", "j"), member="b", local_rank=1,
                        local_world_size=2)
SEALED = Round(3, sealed=True, members={"a": 0, "b": 1})


@pytest.mark.parametrize(
    ("state", "after", "expected"),
    [
        pytest.param(JobState(round=SEALED), None, Assignment(3, 3, 4), id="rank = member rank x nproc + local"),
        pytest.param(JobState(round=SEALED), 3, None, id="a replacement skips the round its predecessor died in"),
        pytest.param(JobState(round=Round(4)), None, None, id="an open round is not joined yet"),
        pytest.param(JobState(round=Round(4, sealed=True, members={"a": 0})), None, None, id="not a member"),
        pytest.param(JobState(), None, None, id="no round at all"),
    ],
)
def test_assignment(state: JobState, after: int | None, expected: Assignment | None) -> None:
    assert assignment(state, CONTEXT, after) == expected


@pytest.mark.parametrize(
    ("state", "over"),
    [
        pytest.param(JobState(round=SEALED), False, id="still the current sealed round"),
        pytest.param(JobState(round=Round(4)), True, id="the next round opened"),
        pytest.param(JobState(round=SEALED, closed=Closed("BackoffLimitExceeded", "spent")), True, id="closed"),
    ],
)
def test_round_over(state: JobState, over: bool) -> None:
    assert round_over(state, 3) is over


def test_the_context_survives_the_environment_and_keeps_secrets_out_of_it() -> None:
    context = WorkerContext("http://h:2379", JobKeys("ns", "j"), "m-1", local_rank=0, local_world_size=1,
                            after_round=7, marker_dir="/tmp/x", auth=EtcdAuth(password="secret"))
    env = context.env()
    assert "secret" not in env.values()
    back = WorkerContext.from_env({**env, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    assert back == WorkerContext("http://h:2379", JobKeys("ns", "j"), "m-1", 0, 1, after_round=7, marker_dir="/tmp/x")
    assert WorkerContext.from_env({}) is None, "under any other launcher there is no in-place context"


@pytest.mark.parametrize("marker", [Marker(41), Marker(41, 3), Marker(41, 3, broken=3)], ids=["new", "joined", "broke"])
def test_a_marker_reads_back_as_written(tmp_path, marker: Marker) -> None:
    marker.write(str(tmp_path), 1)
    assert Marker.read(tmp_path, 1) == marker
    assert Marker.read(tmp_path, 0) is None, "no file: no marker"
