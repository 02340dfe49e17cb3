"""The job's rendezvous state in etcd: every write the protocol makes, each one transaction.

Used by the torchrun handler (agents) and by the controller alike, so that both end rounds and charge
the budget in exactly the same way: a round-ending transaction compares the round's mod revision, which
makes "one incident, one charge" hold however many observers race to report it.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict

from elastic.errors import PermanentError
from elastic.policy.budget import Budget
from elastic.policy.incident import Failure, Incident, JobEnd, RoundEnd, incident_from_reports, incident_of
from elastic.rendezvous.protocol import all_finished, plan_cost, plan_round_end
from elastic.rendezvous.state import (
    Closed,
    Departure,
    JobState,
    Member,
    Round,
    bucket_mask,
    bucket_of,
    bucket_record,
    in_buckets,
    read_by_protocol,
)
from elastic.spec import RestartPolicy, Rule
from elastic.store import Delete, JobKeys, ModRevisionIs, Put, StoreBase, TxnResult, UnchangedSince, dumps

log = logging.getLogger(__name__)


class RunClosedError(PermanentError):
    """The run is closed (budget spent, a FailJob rule, success, delete): no agent may join it."""

    def __init__(self, closed: Closed, run_id: str | None = None) -> None:
        self.closed = closed
        super().__init__(f"job closed ({closed.reason}): {closed.message}" + (f" [run {run_id}]" if run_id else ""))


class RunIdMismatchError(PermanentError):
    pass


class JobRun:
    """One job's keys in etcd, with the transactions of the round protocol."""

    def __init__(self, store: StoreBase, keys: JobKeys) -> None:
        self.store = store
        self.keys = keys

    # --- reading ---

    def read(self, member: str | None = None) -> JobState:
        """The job's state from etcd: every key, or (`member` given) what that member's view holds: all but
        the roster, plus its own member key and its own bucket of the ranks (see `JobView`)."""
        if member is None:
            entries, revision = self.store.get_prefix(self.keys.prefix)
        else:
            entries, revision = self.store.get_ranges(self.member_ranges(member))
            own = self.store.get(self.keys.member(member))
            entries += [own] if own is not None else []
        return JobState.parse(self.keys, [e for e in entries if self.decides_on(e.key)], revision, member is None)

    def member_ranges(self, member: str) -> list[tuple[str, str]]:
        """What a member's view holds, as [start, end) ranges: the job's keys but the roster's, and its own
        bucket of the ranks (the same key in every round)."""
        bucket = self.keys.rank_bucket(bucket_of(member))
        return [*self.keys.member_ranges, (bucket, bucket + "\0")]

    def decides_on(self, key: str) -> bool:
        """False for keys the protocol never reads (the agents' store, progress, the status, worker records)."""
        return read_by_protocol(self.keys, key)

    def failure_policy(self, state: JobState) -> tuple[Sequence[Rule], RestartPolicy]:
        """The job's rules when a spec was submitted (controller, compose); else restart on any failure."""
        if state.spec is None:
            return (), RestartPolicy.ON_FAILURE
        return state.spec.spec.failure_policy.rules, state.spec.spec.restart_policy

    def incident(self, state: JobState, reason: RoundEnd, failure: Failure | None = None) -> Incident:
        """A round end classified by this job's rules."""
        return incident_of(reason, failure, *self.failure_policy(state))

    def incident_from_reports(self, state: JobState, reports: Mapping[str, Failure], silent: Sequence[str]) -> Incident:
        """The incident of the failures reported in a round (and of its silent members), by this job's rules."""
        return incident_from_reports(reports, silent, *self.failure_policy(state))

    # --- the run ---

    def ensure_run(self, run_id: str, max_restarts: int, ttl_seconds: int, reset: bool = False,
                   member: str | None = None) -> JobState:
        """Create the run (run record, budget, first round) once; every later agent just reads it.

        All of the run's keys hang on one job lease, kept alive by the agents; once none is left, the run
        disappears after `ttl_seconds` (nothing of a finished run stays in etcd forever). A submitted spec's
        `failurePolicy.maxRestarts` is the budget, whoever creates the run (agents a platform starts may come
        before their controller, with a `max_restarts` of their own); `max_restarts` is for runs without one.
        `member`: read as that member does (all but the roster), not every key.
        """
        for _ in range(10):
            state = self.read(member)
            if state.run_id is None:
                budget = state.spec.spec.failure_policy.max_restarts if state.spec is not None else max_restarts
                if self._create_run(run_id, budget, ttl_seconds):
                    return self.read(member)
                continue
            if state.run_id != run_id:
                raise RunIdMismatchError(
                    f"job {self.keys.namespace}/{self.keys.name} belongs to run {state.run_id!r}, "
                    f"not {run_id!r}: use another job name (--rdzv-conf job=...) or wait until it is gone"
                )
            if state.closed is not None:
                if reset:
                    self.reset_closed(state)
                    continue
                raise RunClosedError(
                    Closed(
                        state.closed.reason,
                        f"{state.closed.message}. Run id {run_id!r} is finished: start a new run with another "
                        "--rdzv-id, or pass --rdzv-conf reset=1 to start this one afresh",
                        state.closed.at,
                    )
                )
            return state
        raise PermanentError(f"could not initialise run {run_id!r}: its keys keep changing under us")

    def _create_run(self, run_id: str, max_restarts: int, ttl_seconds: int) -> bool:
        lease = self.store.grant(ttl_seconds)
        now = time.time()
        created = self.store.txn(
            [ModRevisionIs(self.keys.run, 0)],
            [
                Put.json(
                    self.keys.run,
                    {"run_id": run_id, "lease": lease, "ttl": ttl_seconds, "created_at": now, "by": _origin()},
                    lease,
                ),
                Put.json(self.keys.budget, Budget(max_restarts).to_json(), lease),
                Put.json(self.keys.round, Round(0, opened_at=now).to_json(), lease),
            ],
        ).succeeded
        if not created:
            self.store.revoke(lease)
        return created

    def reset_closed(self, state: JobState) -> None:
        """Forget a closed run (only if still closed as read: two agents resetting at once reset once)."""
        entry = self.store.get(self.keys.closed)
        if entry is None:
            return
        self.store.txn(
            [ModRevisionIs(self.keys.closed, entry.mod_revision)], [Delete(self.keys.prefix, prefix=True)]
        )
        if state.job_lease:
            self.store.revoke(state.job_lease)

    # --- members ---

    def put_member(self, member: Member, lease: int) -> int:
        """Write the member key; returns the revision at which it was written."""
        return self.store.put_json(self.keys.member(member.id), member.to_json(), lease)

    def seal(self, state: JobState, current: Round, ranks: dict[str, int]) -> int:
        """Seal the open round, if neither it nor any member key changed since `state` was read: the seal's
        revision, 0 when it did not happen.

        One comparison covers every member key (a newcomer or a re-written key makes the seal fail and be
        decided again); a member whose lease runs out in between is seen lost right after, like any loss.
        The same transaction writes the ranks, in buckets (each member watches its own key; the round record
        notes which buckets it wrote, and itself stays a few fields). A bucket this seal does not write keeps
        an older round's ranks, which name their round: nobody reads them as this one's.
        """
        buckets = in_buckets(ranks)
        sealed = Round(
            current.number,
            sealed=True,
            opened_by=current.opened_by,
            opened_at=current.opened_at,
            sealed_at=time.time(),
            size=len(ranks),
            rank_buckets=bucket_mask(buckets),
        )
        lease = state.job_lease
        compare = [ModRevisionIs(self.keys.round, current.mod_revision),
                   UnchangedSince(self.keys.members_prefix, state.revision)]
        ops: list[Put | Delete] = [
            Put.json(self.keys.round, sealed.to_json(), lease),
            *(Put.json(self.keys.rank_bucket(b), bucket_record(current.number, part), lease)
              for b, part in buckets.items()),
        ]
        result = self.store.txn(compare, ops)
        return result.revision if result.succeeded else 0

    def campaign(self, member_id: str, member_lease: int) -> TxnResult:
        """Become the job's sealer if it has none: the key lives on our member lease, so it goes with us.
        Lost, the result's revision is one at which another member's key existed."""
        record = Put.json(self.keys.sealer, {"member": member_id, "at": time.time()}, member_lease)
        return self.store.txn([ModRevisionIs(self.keys.sealer, 0)], [record])

    # --- ending rounds ---

    def end_round(self, state: JobState, current: Round, incident: Incident) -> int:
        """Perform `plan_round_end`: one transaction ends `current`, charging or closing per the incident.

        Returns the revision at which it ended, 0 when `current` was no longer the current round (someone
        else ended it first): then nothing is charged, which is what makes one incident cost one charge.
        """
        plan = plan_round_end(self.keys, state, current, incident, time.time())
        result = self.store.txn(list(plan.compares), list(plan.ops))
        if result.succeeded:
            log.info("round %d ended: %s (%s)", current.number, incident.reason.value, incident.action.value)
            return result.revision
        if plan.close_anyway is not None:
            self.close(state, plan.close_anyway)
        return 0

    def cost_after_end(self, state: JobState, round_number: int, incident: Incident) -> None:
        """Perform `plan_cost` for a round that already ended: charge (or close for) an incident of it that
        its observer could not report in time. Charges are keyed by round, so a second call charges nothing."""
        for _ in range(5):
            plan = plan_cost(self.keys, state, round_number, incident, time.time())
            if plan.close_anyway is not None:
                self.close(state, plan.close_anyway)  # the first reason to close stays
                return
            if not plan.ops or self.store.txn(list(plan.compares), list(plan.ops)).succeeded:
                return
            state = self.read()

    def announce_departure(self, state: JobState, member_id: str, reason: str, round_number: int) -> None:
        """Say why a member is about to leave (the controller scaling down), before it is stopped."""
        departure = Departure(reason, round_number, time.time())
        self.store.put_json(self.keys.departed(member_id), asdict(departure), state.job_lease)

    def report_done(self, state: JobState, member_id: str, round_number: int) -> None:
        """This member's local workers all exited 0 in this round (what a Rank0 success policy waits for)."""
        self.store.put_json(self.keys.done(member_id), {"round": round_number, "at": time.time()}, state.job_lease)

    def report_failure(self, state: JobState, round_number: int, member_id: str, failure: Failure) -> None:
        """Record one observer's failure for the round, so the round ends on the incident's first cause."""
        self.store.put_json(self.keys.incident(round_number, member_id), asdict(failure), state.job_lease)

    def answer_incident(self, round_number: int, member_id: str, member_lease: int) -> None:
        """Say that this member is alive while a peer's failure ends the round (see `Round.expected`).

        On the member's own lease: a member that dies right after answering is not waited for.
        """
        self.store.put_json(self.keys.alive_member(round_number, member_id), {"at": time.time()}, member_lease)

    def close(self, state: JobState, closed: Closed) -> bool:
        """Close the job for every agent, unless it is closed already (the first reason stays)."""
        return self.store.txn(
            [ModRevisionIs(self.keys.closed, 0)], [Put.json(self.keys.closed, closed.to_json(), state.job_lease)]
        ).succeeded

    # --- leaving ---

    def depart(self, state: JobState, member_id: str, reason: str, round_number: int) -> None:
        """Record why a member leaves and remove its key, atomically, so nobody mistakes it for a loss.

        A reason recorded before (the controller's ScaleDown, written before it stops the agent) stays.
        """
        key = self.keys.departed(member_id)
        departure = Put(key, dumps(asdict(Departure(reason, round_number, time.time()))), state.job_lease)
        self.store.txn(
            [ModRevisionIs(key, 0)],
            [departure, Delete(self.keys.member(member_id))],
            [Delete(self.keys.member(member_id))],
        )
        if reason == RoundEnd.FINISHED:
            after = self.read()
            if all_finished(after):
                self.close(after, Closed(JobEnd.SUCCEEDED.value, "every member of the last round finished with exit 0",
                                         time.time()))


def _origin() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"
