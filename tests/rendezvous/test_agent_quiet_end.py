"""An agent's expected ends are one line each in its log, never a traceback burying the worker's error."""

from __future__ import annotations

import signal

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.rendezvous import RendezvousClosedError

from elastic.agent.launcher import quiet_end


def stopped_while(context: BaseException | None) -> SignalException:
    try:
        try:
            if context is not None:
                raise context
        finally:
            raise SignalException("Process 1 got signal: 15", sigval=signal.SIGTERM)
    except SignalException as err:
        return err


def test_a_stop_after_its_workers_finished_is_a_clean_exit() -> None:
    assert quiet_end(stopped_while(None), workers_succeeded=True) == (
        ["stopped while leaving, after its workers finished with exit 0"], 0)


def test_a_stop_while_training_is_one_line_and_a_failure() -> None:
    assert quiet_end(stopped_while(None), workers_succeeded=False) == (["stopped by signal SIGTERM"], 1)


def test_a_closed_job_then_a_stop_while_leaving_says_both_in_order() -> None:
    closed = RendezvousClosedError("job closed (BackoffLimitExceeded): restart budget spent")
    assert quiet_end(stopped_while(closed), workers_succeeded=False) == (
        ["job closed (BackoffLimitExceeded): restart budget spent", "stopped by signal SIGTERM"], 1)
