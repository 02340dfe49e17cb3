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


def test_keys_the_protocol_never_reads_move_the_revision_but_neither_parse_nor_wake(store: Store) -> None:
    """Rank 0's progress (once a second) and the controller's status reach every member's watch; at N members
    a parse of the job for each would be N member records decoded per member per second, for nothing."""
    keys = JobKeys("default", "view-quiet")
    signal = ChangeSignal()
    store.put_json(keys.round, {"round": 1, "sealed": False})
    store.put_json(keys.member("m0"), {"round": 1, "host": "h", "addr": "a", "pid": 1, "joined_at": 1.0})
    view = JobView(JobRun(store, keys), on_change=signal.notify)
    try:
        first = view.state()
        assert set(first.members) == {"m0"}
        store.put_json(keys.status, {"phase": "Running"})
        moved = store.put_json(keys.progress, {"step": 7, "world_size": 1, "at": 1.0})
        assert view.wait_for_change(moved - 1, timeout=10)
        quiet = view.state()
        assert quiet.revision == view.revision == moved  # waiters on state.revision never spin
        assert quiet.members is first.members  # the same parse, not a new one
        assert wait([signal], timeout=0.5) == []  # the in-place agent is not woken either
        joined = store.put_json(keys.member("m1"), {"round": 1, "host": "h", "addr": "a", "pid": 2, "joined_at": 2.0})
        assert view.wait_for_change(joined - 1, timeout=10)
        assert set(view.state().members) == {"m0", "m1"}
        assert wait([signal], timeout=10) == [signal]
    finally:
        view.close()
        signal.close()
