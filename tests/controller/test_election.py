"""One acting local controller: the election decision (pure), and fencing of a deposed leader (real etcd)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from elastic.controller.machinery.etcd_election import Election, LeaderRecord, Step, decide
from elastic.errors import NotLeaderError
from elastic.store import ModRevisionIs, Put, Store
from elastic.store.keys import controller_leader_key


def record(epoch: int, holder: str = "other") -> LeaderRecord:
    return LeaderRecord(holder, epoch, lease=1, info={})


@pytest.mark.parametrize(
    ("leader", "my_epoch", "lease_alive", "expected"),
    [
        (None, None, False, Step.CAMPAIGN),
        (record(7), None, False, Step.FOLLOW),
        (record(7, "me"), 7, True, Step.LEAD),
        (None, 7, True, Step.STEP_DOWN),
        (record(9), 7, True, Step.STEP_DOWN),
        (record(7, "me"), 7, False, Step.STEP_DOWN),
    ],
    ids=[
        "nobody leads: campaign",
        "another controller leads: follow",
        "our key at our epoch on a live lease: lead",
        "our key is gone: step down",
        "the key was re-created by another: step down",
        "our lease was lost: step down even if the key still shows",
    ],
)
def test_decide(leader: LeaderRecord | None, my_epoch: int | None, lease_alive: bool, expected: Step) -> None:
    assert decide(leader, my_epoch, lease_alive) is expected


@pytest.fixture
def elections(store: Store) -> Iterator[list[Election]]:
    """Two controllers, each with its own connection; the leader key is cleaned up afterwards."""
    stores = [Store(store.endpoints_text, retry_seconds=5) for _ in range(2)]
    made = [Election(s) for s in stores]
    yield made
    for election, own in zip(made, stores, strict=True):
        election.resign()
        own.close()
    store.delete(controller_leader_key())


def test_one_leads_the_other_follows_and_takes_over_when_it_resigns(elections: list[Election]) -> None:
    first, second = elections
    assert first.lead() is not None
    assert second.lead() is None
    assert first.lead() is not None, "leadership is kept from step to step"
    first.resign()
    assert second.lead() is not None
    assert first.lead() is None


def test_a_deposed_leader_cannot_write_and_changes_nothing(store: Store, elections: list[Election]) -> None:
    first, second = elections
    fenced = first.lead()
    assert fenced is not None
    fenced.put("/elastic/test/fence", "by-first")
    before = store.get("/elastic/test/fence")
    store.revoke(first.read().lease)  # the lease lapsed (a long pause): the key is gone
    assert second.lead() is not None
    for write in (
        lambda: fenced.put("/elastic/test/fence", "late"),
        lambda: fenced.put_json("/elastic/test/other", {"late": True}),
        lambda: fenced.delete("/elastic/test/fence"),
        lambda: fenced.delete_prefix("/elastic/test/"),
        lambda: fenced.txn([], [Put("/elastic/test/fence", "late")]),
    ):
        with pytest.raises(NotLeaderError, match="no longer the leader"):
            write()
    assert store.get("/elastic/test/fence") == before
    assert store.get("/elastic/test/other") is None
    assert first.lead() is None, "the deposed leader steps down"
    store.delete_prefix("/elastic/test/")


def test_a_fenced_txn_whose_own_compare_fails_is_just_not_applied(store: Store, elections: list[Election]) -> None:
    fenced = elections[0].lead()
    assert fenced is not None
    store.put("/elastic/test/cas", "x")
    assert not fenced.txn([ModRevisionIs("/elastic/test/cas", 0)], [Put("/elastic/test/cas", "y")]).succeeded
    assert store.get("/elastic/test/cas").value == b"x"
    with pytest.raises(ValueError, match="failure ops"):
        fenced.txn([], [Put("/elastic/test/cas", "y")], [Put("/elastic/test/cas", "z")])
    store.delete_prefix("/elastic/test/")
