"""Leader election with a coordination.k8s.io/v1 Lease: the decision as a table, then two electors.

The electors run against a FAKE API server (tests/kubernetes/fake_api.py, no kube-apiserver can run
here) through the real `kubernetes` client; the fake implements the Lease's optimistic concurrency
(a replace with a stale resourceVersion gets 409 Conflict). A real-cluster test would add the API
server's own conflict handling under load, clock skew between nodes, and RBAC enforcement of the
Role that limits get/update to the lease named `elastic-controller`.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from fake_api import FakeApiServer, rbac_allows
from kubernetes import client

from elastic.agents import seconds_until
from elastic.controller.leader import LEASE_NAME, Decision, LeaderElector, LeaseRecord, decide

NOW = 1000.0
RBAC = Path(__file__).resolve().parents[2] / "manifests" / "rbac.yaml"


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (None, Decision.CREATE),
        (LeaseRecord("me", 15, NOW - 100), Decision.RENEW),  # mine, even if expired: renew it
        (LeaseRecord("other", 15, NOW - 5), Decision.WAIT),
        (LeaseRecord("other", 15, NOW - 15), Decision.ACQUIRE),  # expired exactly now
        (LeaseRecord("other", 15, NOW - 16), Decision.ACQUIRE),
        (LeaseRecord("", 15, NOW), Decision.ACQUIRE),  # released
        (LeaseRecord(None, 15, None), Decision.ACQUIRE),
        (LeaseRecord("other", 15, None), Decision.ACQUIRE),
    ],
)
def test_decide(record: LeaseRecord | None, expected: Decision) -> None:
    assert decide(record, "me", NOW) is expected


def test_only_one_of_two_leads_and_the_other_takes_over_within_the_lease(
    fake: FakeApiServer, coordination: client.CoordinationV1Api
) -> None:
    a = LeaderElector(coordination, "elastic-system", "controller-a", lease_seconds=2)
    b = LeaderElector(coordination, "elastic-system", "controller-b", lease_seconds=2)
    assert a.try_acquire_or_renew() is True
    for _ in range(5):
        assert b.try_acquire_or_renew() is False
        assert a.try_acquire_or_renew() is True
    lease = fake.leases[("elastic-system", LEASE_NAME)]["spec"]
    assert lease["holderIdentity"] == "controller-a" and lease["leaseDurationSeconds"] == 2
    assert lease["leaseTransitions"] == 0

    # controller-a is killed: it renews no more. controller-b leads once the lease expired, not before.
    killed_at = time.monotonic()
    waited = seconds_until(b.try_acquire_or_renew, timeout=2 + 1.5)
    assert waited <= 2 + 1.0
    assert time.monotonic() - killed_at >= 2 - 0.5  # it waited for the lease to expire
    lease = fake.leases[("elastic-system", LEASE_NAME)]["spec"]
    assert lease["holderIdentity"] == "controller-b" and lease["leaseTransitions"] == 1
    # controller-a comes back: it sees the lease taken and follows.
    assert a.try_acquire_or_renew() is False and a.is_leader is False
    assert b.try_acquire_or_renew() is True

    allowed = rbac_allows(list(yaml.safe_load_all(RBAC.read_text())))
    assert set(fake.requests) <= allowed


def test_a_stale_write_is_a_conflict_and_loses(fake: FakeApiServer, coordination: client.CoordinationV1Api) -> None:
    a = LeaderElector(coordination, "ns", "a", lease_seconds=2)
    b = LeaderElector(coordination, "ns", "b", lease_seconds=2)
    assert a.try_acquire_or_renew()
    stale = b.read()
    with fake.lock:  # the lease expired: both see it free, but a's take-over lands first
        fake.leases[("ns", LEASE_NAME)]["spec"]["renewTime"] = "2000-01-01T00:00:00.000001Z"
    c = LeaderElector(coordination, "ns", "c", lease_seconds=2)
    assert c.try_acquire_or_renew() is True
    b.read = lambda: stale  # type: ignore[method-assign]  # b decides on what it read before c's write
    assert b.try_acquire_or_renew() is False  # 409 Conflict: someone else won
    assert fake.leases[("ns", LEASE_NAME)]["spec"]["holderIdentity"] == "c"


def test_release_hands_over_at_once(fake: FakeApiServer, coordination: client.CoordinationV1Api) -> None:
    a = LeaderElector(coordination, "ns", "a", lease_seconds=30)
    b = LeaderElector(coordination, "ns", "b", lease_seconds=30)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    a.release()
    assert b.try_acquire_or_renew() is True and a.try_acquire_or_renew() is False


def test_an_unreachable_api_server_keeps_a_leader_only_until_its_renew_deadline(
    fake: FakeApiServer, coordination: client.CoordinationV1Api
) -> None:
    a = LeaderElector(coordination, "ns", "a", lease_seconds=1)
    assert a.try_acquire_or_renew()
    fake.fail_leases = True
    assert a.try_acquire_or_renew() is True  # one failed renewal is not a lost lease
    seconds_until(lambda: not a.try_acquire_or_renew(), timeout=1.5)
    assert a.is_leader is False
