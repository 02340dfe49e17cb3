"""Leader election with a coordination.k8s.io/v1 Lease: the decisions as tables, then electors.

The pure decisions need no server. The electors run with an injected clock against an in-memory model of
the Lease API (tests/kubernetes/lease_model.py), and with real time and the renew thread against the FAKE
API server (tests/kubernetes/fake_api.py, no kube-apiserver can run here) through the real `kubernetes`
client; one script shows the model and the fake keep the same resourceVersion/409 rules. A real-cluster
test would add the API server's own conflict handling under load, real clock skew between nodes, and RBAC
enforcement of the Role that limits get/update to the lease named `elastic-controller`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_api import FakeApiServer, rbac_allows
from kubernetes import client
from lease_model import Call, Fault, MemoryLeases, SimTime

from elastic.controller.machinery.lease_election import (
    LEASE_NAME,
    Decision,
    KubernetesLeases,
    LeaderElector,
    LeaseApi,
    LeaseConflict,
    LeaseRecord,
    Observed,
    Outcome,
    acting_until,
    decide,
    lease_body,
    observe,
    parse_lease,
)
from harness.agents import seconds_until, wait_until

NOW = 1000.0
HOUR = 3600.0
RBAC = Path(__file__).resolve().parents[2] / "manifests" / "rbac.yaml"


def seen(holder: str | None, ago: float, renew_time: float | None = NOW, duration: int = 15) -> Observed:
    """A record held by `holder`, first seen `ago` seconds before NOW on my clock."""
    return Observed(LeaseRecord(holder, duration, renew_time, resource_version="7"), NOW - ago)


@pytest.mark.parametrize(
    ("observed", "expected"),
    [
        (None, Decision.CREATE),
        (seen("me", 100), Decision.RENEW),
        (seen("other", 5), Decision.WAIT),
        (seen("other", 15), Decision.ACQUIRE),
        (seen("other", 16), Decision.ACQUIRE),
        (seen("", 0), Decision.ACQUIRE),
        (seen(None, 0, renew_time=None), Decision.ACQUIRE),
        (seen("other", 5, renew_time=None), Decision.WAIT),
        (seen("other", 16, renew_time=NOW + HOUR), Decision.ACQUIRE),
        (seen("other", 5, renew_time=NOW - HOUR), Decision.WAIT),
        (seen("other", 5, renew_time=NOW + 365 * 24 * HOUR), Decision.WAIT),
        (seen("other", 16, renew_time=0.0), Decision.ACQUIRE),
    ],
    ids=[
        "no lease: create it",
        "mine, however long ago I saw it: renew it",
        "another's, changed 5 s ago: wait",
        "another's, unchanged for exactly its duration: take it over",
        "another's, unchanged for longer: take it over",
        "released (no holder): take it over",
        "never held: take it over",
        "another's without a renewTime, changed 5 s ago: wait",
        "holder's clock an hour ahead does not extend its lease",
        "holder's clock an hour behind does not expire its lease",
        "holder's clock a year ahead: still by my observation (wait)",
        "holder's clock at the epoch: still by my observation (take over)",
    ],
)
def test_decide_by_when_i_saw_it_change(observed: Observed | None, expected: Decision) -> None:
    assert decide(observed, "me", NOW) is expected


@pytest.mark.parametrize("renew_time", [None, 0.0, NOW - HOUR, NOW, NOW + HOUR, 4e9])
def test_the_holders_timestamps_never_change_a_decision(renew_time: float | None) -> None:
    for ago in (0.0, 14.9, 15.0, 30.0):
        skewed = Observed(LeaseRecord("other", 15, renew_time, acquire_time=renew_time), NOW - ago)
        assert decide(skewed, "me", NOW) is decide(seen("other", ago), "me", NOW)


V1 = LeaseRecord("other", 15, NOW, resource_version="1")
V2 = LeaseRecord("other", 15, NOW + 3, resource_version="2")


@pytest.mark.parametrize(
    ("previous", "record", "expected"),
    [
        (None, None, None),
        (Observed(V1, 10.0), None, None),
        (None, V1, Observed(V1, 50.0)),
        (Observed(V1, 10.0), V1, Observed(V1, 10.0)),
        (Observed(V1, 10.0), V2, Observed(V2, 50.0)),
        (Observed(V2, 10.0), V1, Observed(V1, 50.0)),
    ],
    ids=[
        "no lease: nothing observed",
        "deleted: nothing observed",
        "first sight: seen now",
        "the same version again: still seen when first seen",
        "a renewal (new version): seen now",
        "an older version (a stale read): seen now, which only delays a take-over",
    ],
)
def test_observe_records_when_a_version_was_first_seen(
    previous: Observed | None, record: LeaseRecord | None, expected: Observed | None
) -> None:
    assert observe(previous, record, 50.0) == expected


@pytest.mark.parametrize(
    ("outcome", "until", "expected"),
    [
        (Outcome.HELD, None, 110.0),
        (Outcome.HELD, 105.0, 110.0),
        (Outcome.UNKNOWN, 105.0, 105.0),
        (Outcome.UNKNOWN, None, None),
        (Outcome.CONFLICT, 105.0, None),
        (Outcome.FOREIGN, 105.0, None),
    ],
    ids=[
        "acquired: act until the deadline counted from the attempt's start",
        "renewed: the deadline moves on",
        "no answer: act only until the last deadline",
        "no answer while following: still not acting",
        "409 conflict: stop at once",
        "another holder: stop at once",
    ],
)
def test_acting_until(outcome: Outcome, until: float | None, expected: float | None) -> None:
    assert acting_until(outcome, until, started=100.0, renew_deadline=10.0) == expected


class Replica:
    """An elector with its own clock over the in-memory API, and what its callbacks were told."""

    def __init__(self, api: LeaseApi, time: SimTime, identity: str, offset: float = 0.0, rate: float = 1.0) -> None:
        self.events: list[str] = []
        self.elector = LeaderElector(
            api, "ns", identity, 15, clock=time.clock(offset, rate), wall=time.clock(1.7e9 + offset),
            on_started_leading=lambda: self.events.append("started"),
            on_stopped_leading=lambda why: self.events.append(f"stopped: {why}"),
        )  # fmt: skip


def test_a_follower_takes_over_a_lease_duration_after_it_saw_the_last_renewal_on_its_own_clock() -> None:
    time = SimTime()
    api = MemoryLeases(time)
    a = Replica(api, time, "a", offset=-5000.0)
    b = Replica(api, time, "b", offset=123456.0, rate=1.05)
    assert a.elector.step() and a.events == ["started"]
    assert not b.elector.step()
    time.now = 9.0
    assert a.elector.step() and not b.elector.step()  # b sees the renewal at 9: it waits until 9 + 15/1.05
    time.now = 9.0 + 10.0  # a renews no more (killed); its acting ended at 9 + 10 on its clock
    assert not a.elector.acting
    assert not b.elector.step()
    time.now = 9.0 + 15 / 1.05 + 0.01
    assert b.elector.step() and b.events == ["started"]
    assert api.objects[("ns", LEASE_NAME)]["spec"]["leaseTransitions"] == 1
    # a comes back: it sees b's lease and says it lost
    assert not a.elector.step() and a.events[-1] == "stopped: ns/elastic-controller is now held by b"


def test_a_renewal_with_no_answer_keeps_the_leader_only_until_its_renew_deadline() -> None:
    time = SimTime()
    faults: list[Call] = []
    api = MemoryLeases(time, plan=lambda verb: faults.pop(0) if faults else Call())
    a = Replica(api, time, "a")
    assert a.elector.step()
    time.now = 3.0
    faults.append(Call(fault=Fault.REFUSED))
    assert a.elector.step(), "one unanswered renewal is not a lost lease"
    time.now = 9.0
    faults.append(Call(before=2.0, fault=Fault.REFUSED))
    assert not a.elector.step(), "the deadline (10 s after the last success started) passed during the call"
    assert a.events == ["started", "stopped: ns/elastic-controller not renewed within 10.0 s"]
    assert a.elector.step() and a.events[-1] == "started", "the lease was still its own: it renews it"


def test_a_write_whose_answer_was_lost_counts_as_nothing_and_is_seen_on_the_next_read() -> None:
    time = SimTime()
    faults = [Call(), Call(fault=Fault.REPLY_LOST)]  # the read, then the create that landed unanswered
    api = MemoryLeases(time, plan=lambda verb: faults.pop(0) if faults else Call())
    a = Replica(api, time, "a")
    assert not a.elector.step() and a.events == []
    assert api.objects[("ns", LEASE_NAME)]["spec"]["holderIdentity"] == "a"
    assert a.elector.step() and a.events == ["started"]


@pytest.fixture(params=["fake API server", "in-memory model"])
def leases(request: pytest.FixtureRequest) -> LeaseApi:
    if request.param == "in-memory model":
        return MemoryLeases(SimTime())
    return KubernetesLeases(request.getfixturevalue("coordination"), timeout=5)


def test_the_model_keeps_the_api_servers_rules(leases: LeaseApi) -> None:
    assert leases.get("ns", "l") is None
    first = parse_lease(leases.create("ns", lease_body("ns", "l", "a", 15, None, True, NOW)))
    with pytest.raises(LeaseConflict):
        leases.create("ns", lease_body("ns", "l", "b", 15, None, True, NOW))
    second = parse_lease(leases.replace("ns", "l", lease_body("ns", "l", "a", 15, first, False, NOW + 1)))
    assert second.resource_version != first.resource_version and second.transitions == 0
    with pytest.raises(LeaseConflict):  # b decided on the first version: a renewed since
        leases.replace("ns", "l", lease_body("ns", "l", "b", 15, first, True, NOW + 2))
    third = parse_lease(leases.replace("ns", "l", lease_body("ns", "l", "b", 15, second, True, NOW + 2)))
    assert (third.holder, third.transitions, third.renew_time) == ("b", 1, NOW + 2)
    assert parse_lease(leases.get("ns", "l") or {}) == third


# --- the renew thread, against the fake API server, in real time ---


def elector(coordination: client.CoordinationV1Api, identity: str, lease: int = 1, **kw: Any) -> LeaderElector:
    return LeaderElector(KubernetesLeases(coordination, timeout=lease / 5), "elastic-system", identity, lease, **kw)


def test_the_renew_thread_keeps_the_lease_while_the_main_thread_does_nothing(
    fake: FakeApiServer, coordination: client.CoordinationV1Api
) -> None:
    a = elector(coordination, "controller-a").start()
    b = elector(coordination, "controller-b")
    try:
        assert wait_until(lambda: a.acting, timeout=5)
        b.start()
        versions = set()

        def renewed_three_times() -> bool:
            versions.add(fake.leases[("elastic-system", LEASE_NAME)]["metadata"]["resourceVersion"])
            return len(versions) >= 4

        assert wait_until(renewed_three_times, timeout=5, interval=0.05)
        assert a.acting and not b.acting
        assert fake.leases[("elastic-system", LEASE_NAME)]["spec"]["holderIdentity"] == "controller-a"

        a.stop()  # controller-a is killed: it renews no more. b leads once it saw no renewal for 1 s
        waited = seconds_until(lambda: b.acting, timeout=3, poll=0.05)
        assert 1 - 0.3 <= waited <= 1 + 1.0
        assert not a.acting, "a's own deadline (2/3 of the lease) ended its acting before b began"
        lease = fake.leases[("elastic-system", LEASE_NAME)]["spec"]
        assert lease["holderIdentity"] == "controller-b" and lease["leaseTransitions"] == 1
        assert a.step() is False and a.lost.is_set()  # a, back, follows
    finally:
        a.stop()
        b.stop()
    assert set(fake.requests) <= rbac_allows(list(yaml.safe_load_all(RBAC.read_text())))


def test_a_foreign_holder_stops_the_leader_at_once_and_tells_it(
    fake: FakeApiServer, coordination: client.CoordinationV1Api
) -> None:
    told: list[str] = []
    a = elector(coordination, "a", lease=30, on_stopped_leading=told.append)
    assert a.step() and a.acting
    intruder = KubernetesLeases(coordination, timeout=5)  # another replica that (wrongly) took the lease
    body = lease_body("elastic-system", LEASE_NAME, "x", 30, a.read(), True, NOW)
    intruder.replace("elastic-system", LEASE_NAME, body)
    assert a.step() is False and a.acting is False
    assert told == ["elastic-system/elastic-controller is now held by x"]


def test_a_conflict_stops_the_leader_at_once_and_tells_it(
    fake: FakeApiServer, coordination: client.CoordinationV1Api
) -> None:
    told: list[str] = []
    leases = KubernetesLeases(coordination, timeout=5)
    a = elector(coordination, "a", lease=30, on_stopped_leading=told.append)
    assert a.step() and a.acting

    def another_replica_writes() -> None:
        current = parse_lease(leases.get("elastic-system", LEASE_NAME) or {})
        body = lease_body("elastic-system", LEASE_NAME, "x", 30, current, True, NOW)
        leases.replace("elastic-system", LEASE_NAME, body)

    a.api = Racing(leases, after_read=another_replica_writes)  # a decides on what it read: renew
    assert a.step() is False and a.acting is False
    assert told == ["another replica wrote elastic-system/elastic-controller first (409 Conflict)"]
    assert fake.leases[("elastic-system", LEASE_NAME)]["spec"]["holderIdentity"] == "x"


class Racing:
    """A LeaseApi whose reads are followed at once by another replica's write (before ours can land)."""

    def __init__(self, inner: LeaseApi, after_read: Callable[[], object]) -> None:
        self.inner = inner
        self.after_read = after_read

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.inner.get(namespace, name)
        self.after_read()
        return found

    def create(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.inner.create(namespace, body)

    def replace(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.inner.replace(namespace, name, body)


def test_release_hands_over_at_once(fake: FakeApiServer, coordination: client.CoordinationV1Api) -> None:
    a = elector(coordination, "a", lease=30)
    b = elector(coordination, "b", lease=30)
    assert a.step() and not b.step()
    a.release()
    assert not a.acting and not a.lost.is_set(), "a release is not a loss"
    assert b.step() is True and a.step() is False


def test_an_unreachable_api_server_keeps_a_leader_only_until_its_renew_deadline(
    fake: FakeApiServer, coordination: client.CoordinationV1Api
) -> None:
    lost = threading.Event()
    a = elector(coordination, "a", lease=1, on_stopped_leading=lambda why: lost.set()).start()
    try:
        assert wait_until(lambda: a.acting, timeout=5)
        fake.fail_leases = True
        cut = seconds_until(lambda: not a.acting, timeout=2, poll=0.02)
        assert cut <= 2 / 3 + 0.2 + 0.1  # at most the renew deadline after the last success began
        assert wait_until(lost.is_set, timeout=1) and "not renewed within 0.7 s" in a.lost_reason
    finally:
        a.stop()
