"""The view's change signal on a real etcd: what the in-place agent waits on beside its workers' sentinels, so
that a round ended elsewhere wakes it at once rather than at its next monitor tick."""

from __future__ import annotations

from multiprocessing.connection import wait

from elastic.rendezvous.run import JobRun
from elastic.rendezvous.view import ChangeSignal, JobView
from elastic.store import JobKeys, Store


def test_a_change_of_the_jobs_keys_makes_the_signal_readable_until_cleared(store: Store) -> None:
    keys = JobKeys("default", "view-signal")
    signal = ChangeSignal()
    view = JobView(JobRun(store, keys), on_change=signal.notify)
    try:
        assert wait([signal], timeout=0) == []  # nothing moved yet
        store.put_json(keys.round, {"round": 1, "sealed": False})
        assert wait([signal], timeout=10) == [signal]
        assert wait([signal], timeout=0) == [signal]  # stays readable: a wake-up is never lost
        signal.clear()
        assert wait([signal], timeout=0) == []
        for n in range(3):  # many changes while nobody waits: one pending wake-up, cleared at once
            last = store.put_json(keys.round, {"round": 2 + n, "sealed": False})
        assert view.wait_for_change(last - 1, timeout=10)
        assert wait([signal], timeout=10) == [signal]
        signal.clear()
        assert wait([signal], timeout=0) == []
    finally:
        view.close()
        signal.close()
    signal.notify()  # after close: a no-op, never a write to a descriptor number reused since
    signal.clear()
