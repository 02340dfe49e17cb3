"""The controller's work queue: each job once, never handled twice at once, failures backed off alone."""

from __future__ import annotations

import pytest

from elastic.controller.machinery.workqueue import WorkQueue, retry_delay


@pytest.mark.parametrize(
    ("failures", "low", "high"),
    [
        pytest.param(0, 0.0, 0.0, id="no failure, no delay"),
        pytest.param(1, 0.25, 0.5, id="the first retry after about the base delay"),
        pytest.param(4, 2.0, 4.0, id="doubling with each failure"),
        pytest.param(30, 30.0, 60.0, id="capped"),
    ],
)
def test_retry_delay(failures: int, low: float, high: float) -> None:
    for _ in range(50):
        assert low <= retry_delay(failures, base=0.5, cap=60.0) <= high


def test_a_key_is_queued_once_and_handled_by_one_worker_at_a_time() -> None:
    queue = WorkQueue()
    queue.add("a")
    queue.add("a")
    queue.add("b")
    assert queue.get(0) == "a"
    queue.add("a")  # changed again while being handled: once more, after it is done
    assert queue.get(0) == "b"
    assert queue.get(0) is None
    queue.done("a")
    assert queue.get(0) == "a"


def test_a_failing_key_backs_off_alone_and_forget_resets_it() -> None:
    queue = WorkQueue(base_delay=0.05, max_delay=0.05)
    queue.add("bad")
    assert queue.get(0) == "bad"
    queue.retry("bad")
    queue.done("bad")
    queue.add("good")
    assert queue.get(0) == "good", "the other key is not held up by the failing one"
    queue.done("good")
    assert queue.get(0) is None, "the failing key waits out its delay"
    assert queue.get(1.0) == "bad"
    queue.forget("bad")
    queue.done("bad")


def test_a_key_waits_once_at_the_earliest_time_asked() -> None:
    queue = WorkQueue()
    for _ in range(5):
        queue.add_after("a", 30.0)  # every event of a running job asks again: still one entry
    queue.add_after("a", 0.05)
    assert len(queue) == 1
    assert queue.get(1.0) == "a"
    queue.done("a")
    assert queue.get(0.1) is None, "the later requests were folded into the earliest"
