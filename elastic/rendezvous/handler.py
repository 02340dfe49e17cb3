"""torch's `RendezvousHandler` for the `etcd-v3` backend: the executor of the round protocol.

Decisions come from `protocol.py`; this class performs them against etcd and answers torch's agent:
- `next_rendezvous()` ends the round it trained in (if still current) with the right incident, then
  joins the next one and returns a fresh etcd-backed agent store for it;
- `num_nodes_waiting()` turns positive on *any* membership change (a waiting joiner, a lost member, an
  ended round, a closed job), answered from a watched copy of the job's keys without an etcd request;
- `shutdown()` only takes this member out; it never closes the job for the others (docs/design.md §3.9).
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import socket
import sys
import threading
import time

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)

from elastic.cluster.reaper import guard_this_agent
from elastic.codec import CorruptValueError
from elastic.errors import LeaseLostError, StoreUnavailableError
from elastic.policy.budget import Charge, amends
from elastic.policy.exits import Action
from elastic.policy.incident import (
    FREE_ENDS,
    NODE_LOST,
    Failure,
    Incident,
    JobEnd,
    RoundEnd,
    bounded_error,
    silent_members,
)
from elastic.rendezvous.agent_store import EtcdAgentStore
from elastic.rendezvous.config import RendezvousConfig
from elastic.rendezvous.fence import RoundFence
from elastic.rendezvous.protocol import (
    Change,
    EndDeadRound,
    EndRound,
    Joined,
    Refuse,
    Seal,
    Settings,
    Target,
    Wait,
    change_after_own_failure,
    gathered_for,
    join_step,
    membership_change,
)
from elastic.rendezvous.run import JobRun, RunClosedError
from elastic.rendezvous.state import Closed, JobState, Member, Round
from elastic.rendezvous.view import ChangeSignal, JobView
from elastic.rendezvous.worker_exits import recorded_error
from elastic.store import GatewayStore, LeaseKeeper, StoreBase, dumps

log = logging.getLogger(__name__)

BACKEND = "etcd-v3"
AT_EXIT_RETRY_SECONDS = 2.0
# The sealer decides again on every join it sees, and a decision reads every member (about a millisecond at
# 1,024): it spends at most 1 / SEALER_PACE of its time deciding, and waits at most this long for a decision.
SEALER_PACE = 4
SEALER_PACE_MAX_SECONDS = 0.05
# How long a member waits for its view to show its own write (a seal, a round's end) before deciding anyway.
OWN_WRITE_WAIT_SECONDS = 5.0


class RendezvousStateError(RendezvousError):
    """A key of the job does not decode: this agent cannot take part until it is fixed (not a failure)."""


class EtcdV3RendezvousHandler(RendezvousHandler):
    def __init__(self, config: RendezvousConfig, store: StoreBase | None = None) -> None:
        self.config = config
        self.settings = Settings(config.min_nodes, config.max_nodes, config.last_call_seconds, config.spares)
        # The controller's worker name leads the id, so that it can tell which member a worker was.
        origin = os.environ.get("ELASTIC_WORKER") or socket.gethostname()
        self.member_id = f"{origin}-{os.getpid()}-{secrets.token_hex(2)}"
        # Before any worker starts: whoever started this agent (stock torchrun too), its workers end with it.
        guard_this_agent()
        # A connection of its own is on etcd's HTTP gateway, never gRPC: the agent's process may be someone
        # else's program that forks (torch's test suites fork agents from a process whose handlers never shut
        # down), and gRPC's threads made those forks abort or hang (issue 44; docs/design.md "Fork safety").
        # It is closed when the member leaves.
        self._owns_store = store is None
        self.store = store or GatewayStore(config.endpoints, auth=config.auth, retry_seconds=15)
        self.run = JobRun(self.store, config.job)
        self._view: JobView | None = None
        # Readable whenever the job's keys move: what the in-place agent waits on beside its workers.
        self.changes = ChangeSignal()
        self._job_lease: LeaseKeeper | None = None
        self._member_lease: LeaseKeeper | None = None
        self._joined: Round | None = None
        self._joined_at = 0.0
        self._pending: Change | None = None
        self._campaign_lost_at = 0  # the revision of our last lost campaign (see `_campaign`)
        self._worker_failure: Failure | None = None
        self._lock = threading.Lock()
        self._shut_down = False
        # The in-place agent sets this: its survivors never exit collaterally, so once every member of the
        # round reported or answered, there is no root cause left to wait for (see `_settle`).
        self.settle_until_heard = False
        atexit.register(self._at_exit)

    # --- torch's interface ---

    def get_backend(self) -> str:
        return BACKEND

    def get_run_id(self) -> str:
        return self.config.run_id

    @property
    def use_agent_store(self) -> bool:
        # Workers get a fresh MASTER_ADDR/PORT every round (rank 0 of the round picks a free port); no
        # TCPStore lives across rounds (pytorch#135712).
        return False

    def next_rendezvous(self) -> RendezvousInfo:
        deadline = time.monotonic() + self.config.join_timeout
        while True:
            try:
                self._ensure_started()
                if self._joined is not None:
                    self._end_trained_round()
                joined = self._join()
                break
            except RunClosedError as err:
                raise RendezvousClosedError(str(err)) from None
            except CorruptValueError as err:
                raise RendezvousStateError(str(err)) from None
            except StoreUnavailableError as err:
                if isinstance(err, LeaseLostError) and self._member_lease_gone():
                    log.warning("member %s lost its lease while joining (%s): it joins again under a new one",
                                self.member_id, err)
                    continue
                # etcd is away: not this job's failure. Keep trying until the join timeout, as a joiner
                # waiting for peers would (docs/design.md §3.11); workers stay stopped meanwhile (fenced).
                if time.monotonic() > deadline:
                    raise RendezvousConnectionError(str(err)) from None
                log.warning("etcd unavailable, retrying the rendezvous: %s", err)
        with self._lock:
            self._joined, self._pending, self._worker_failure = joined.round, None, None
        assert self._view is not None
        log.info("member %s joined round %d as rank %d of %d", self.member_id, joined.round.number, joined.rank,
                 joined.round.world_size)
        # The round's workers inherit this agent's environment: their fencing token, and how to check it.
        run_id = self._view.state().run_id or ""
        os.environ.update({**self.config.auth.env(), **RoundFence(
            self.config.endpoints, self.run.keys, run_id, joined.round.number).env()})
        agent_store = EtcdAgentStore(
            self.store, self.run.keys.store(joined.round.number), self._job_lease_id(), self._view
        )
        bootstrap = RendezvousStoreInfo.build(joined.rank, agent_store, local_addr=self.config.local_addr)
        return RendezvousInfo(agent_store, joined.rank, joined.round.world_size, bootstrap)

    def num_nodes_waiting(self) -> int:
        with self._lock:
            if self._joined is None or self._view is None:
                return 0
            if self._member_lease is not None and self._member_lease.lost.is_set():
                reason = RoundEnd.STORE_UNAVAILABLE if self._member_lease.unreachable else RoundEnd.MEMBER_LOST
                self._pending = self._pending or Change(reason, member=self.member_id)
                return 1
            state = self._lead_if_leaderless(self._view.state())
            if state.corrupt:
                return 0  # decide nothing on a bad key: training goes on, the controller reports it
            change = membership_change(state, self._joined.number, self.settings)
            if change is None:
                return 0
            if change.reason is RoundEnd.MEMBER_LOST and self._store_was_away():
                change = Change(RoundEnd.STORE_UNAVAILABLE, member=change.member)
            self._pending = self._pending or change
            return change.waiting

    @property
    def joined_round(self) -> int | None:
        """The round this agent last joined (in-place workers are told it: a replacement joins only later ones)."""
        with self._lock:
            return self._joined.number if self._joined is not None else None

    def is_closed(self) -> bool:
        state = self._view.state() if self._view else self.run.read()
        return state.closed is not None

    def set_closed(self) -> None:
        self.run.close(self.run.read(), Closed(JobEnd.CLOSED.value, f"closed by agent {self.member_id}", time.time()))

    def shutdown(self) -> bool:
        """Leave the job: as *finished* when every local worker exited 0, else as a loss or a stop.

        torch calls this from a `finally` block, so the exception in flight (if any) says why the agent
        ends: none means success; ChildFailedError means its workers failed and it gave up, which ends the
        round with that failure's exit code, classified by the job's rules.
        """
        ending = sys.exc_info()[1]
        if isinstance(ending, RendezvousStateError):
            self._leave(RoundEnd.CORRUPT_STATE)
        elif isinstance(ending, SignalException):
            # SIGTERM is notice (a pod deleted with grace, a spot reclaim): leave as a stop on purpose, free,
            # before the workers are stopped, so that the survivors carry on (docs/design.md §3.3)
            self._leave(RoundEnd.PREEMPTED)
        elif isinstance(ending, ChildFailedError):
            self.report_worker_failure(*_first_failure(ending))
            self._leave(None)
        else:
            self._leave(RoundEnd.FINISHED if ending is None else None)
        return True

    # --- reported by the agents (`elastic agent`: torch's agent with exit codes; the in-place agent) ---

    def report_worker_failure(
        self, exit_code: int | None, at: float | None = None, error: str | None = None, stopped: bool = False
    ) -> None:
        """This agent's first failed worker: its exit code, when it died, the tail of its own error.

        Kept as the failure this member reports when the round ends (the first one: later ones are its
        consequences); which member's failure is the incident's cause is decided among all the reports.
        """
        with self._lock:
            if self._worker_failure is None:
                self._worker_failure = Failure(exit_code, member=self.member_id, at=at or time.time(),
                                               error=bounded_error(error), stopped=stopped)

    def report_lost_peer(self) -> None:
        """A peer vanished from this agent's workers' group and nobody reported it (the in-place agent): the
        round ends as a lost node, charged once, without waiting for the lost member's lease to run out; the
        member blamed is the one that stays silent while the round ends (`first_failure`)."""
        with self._lock:
            if self._worker_failure is None:
                self._worker_failure = Failure(None, reason=NODE_LOST, at=time.time())

    def report_local_success(self) -> None:
        """Every local worker exited 0 (the agent now waits in torch's exit barrier for the others)."""
        if self._joined is not None and self._view is not None:
            self.run.report_done(self._view.state(), self.member_id, self._joined.number)

    # --- the protocol's executor ---

    def _ensure_started(self) -> None:
        if self._view is not None:
            if self._member_lease is not None and self._member_lease.lost.is_set():
                self._regrant()
            return
        state = self.run.ensure_run(
            self.config.run_id, self.config.max_restarts, self.config.ttl_seconds, self.config.reset, self.member_id
        )
        if state.job_lease is not None:
            # Refreshed by the TTL its creator granted, not by ours: a run created with a shorter TTL (by the
            # controller, a test, an agent configured otherwise) would otherwise lapse between our keep-alives.
            self._job_lease = LeaseKeeper(self.store, state.job_lease, state.job_ttl or self.config.ttl_seconds)
            self._job_lease.start()
        self._member_lease = LeaseKeeper.grant(self.store, self.config.lease_seconds)
        self._joined_at = time.time()
        self._view = JobView(self.run, on_change=self.changes.notify, member=self.member_id)
        threading.Thread(target=self._answer_incidents, name="incident-answer", daemon=True).start()

    def _lead_if_leaderless(self, state: JobState) -> JobState:
        """Campaign to be the job's sealer when it has none (the first member, or the sealer is gone): the
        winner widens its view to the member keys, seals, and ends rounds on their changes; every other
        member watches only the keys that decide its own fate (docs/design.md §3.20)."""
        assert self._view is not None
        lease = self._member_lease
        if self._view.whole or lease is None or lease.lost.is_set():
            return state
        try:
            if state.sealer == self.member_id or (state.sealer is None and self._campaign(state, lease.lease_id)):
                log.info("member %s seals the rounds of job %s/%s", self.member_id, self.run.keys.namespace,
                         self.run.keys.name)
                self._view.widen()
                return self._view.state()
        except StoreUnavailableError as err:
            log.warning("could not campaign to seal rounds: %s", err)
        return state

    def _campaign(self, state: JobState, lease_id: int) -> bool:
        """One campaign per absence of a sealer: a lost campaign saw another's key at its revision, so until our
        view has caught up with that revision, a missing key means we have not seen it yet, not that it went."""
        if state.revision < self._campaign_lost_at:
            return False
        result = self.run.campaign(self.member_id, lease_id)
        if not result.succeeded:
            self._campaign_lost_at = result.revision
        return result.succeeded

    def _sealer_overdue(self, state: JobState, waiting_since: float) -> bool:
        """A sealer that holds its lease but does not seal (its agent hangs) must not stall the job: a member
        that waited in an open round past its last call and a lease widens its view and may seal itself (the
        seal's transaction keeps it to one seal)."""
        assert self._view is not None
        current = state.round
        patience = self.config.last_call_seconds + self.config.lease_seconds
        return (not self._view.whole and current is not None and not current.sealed
                and self.member_id in state.members and time.monotonic() - waiting_since > patience)

    def _regrant(self) -> None:
        """A new member lease after ours was lost: the key it held is gone with it (a member's view keeps its
        own key as written, not watched: forget it, so that the join writes it again)."""
        assert self._view is not None
        self._member_lease = LeaseKeeper.grant(self.store, self.config.lease_seconds)
        self._view.wrote(self.run.keys.member(self.member_id), None, 0)

    def _member_lease_gone(self) -> bool:
        """A write was refused for a lease etcd no longer has. If it was our member lease (gone before its keeper
        noticed: an overloaded etcd expired it), every write under it would be refused the same way: report it
        lost now, so that the join takes a new one (`_ensure_started`) instead of retrying in vain."""
        try:
            return self._member_lease is not None and self._member_lease.confirm_lost()
        except StoreUnavailableError:
            return False

    def _scope(self) -> str | None:
        """What this member reads of the job: everything (None) once it is the sealer, else its own part."""
        assert self._view is not None
        return None if self._view.whole else self.member_id

    def _job_lease_id(self) -> int | None:
        return self._job_lease.lease_id if self._job_lease else None

    def _end_trained_round(self) -> None:
        """End the round this agent trained in, if nobody has yet; one transaction decides who charges."""
        assert self._joined is not None and self._view is not None
        number = self._joined.number
        if self._worker_failure is None and not _is_current(self._view.state(), number):
            return  # ended by someone else (the view follows etcd), and nothing of ours to report: nothing to read
        state = self._decodable(self.run.read(self._scope()))
        seen = self._pending or membership_change(state, number, self.settings)
        change = change_after_own_failure(seen, self._worker_failure, self.member_id)
        if change is None and _is_current(state, number):
            # Our own workers failed: report, and give the other observers of the same incident a moment
            # to report theirs, so that the round ends on the first cause.
            self.run.report_failure(state, number, self.member_id, self._own_failure())
            state = self._settle(number)
        for _ in range(5):
            if not _is_current(state, number):
                self._cost_of_unreported_failure(state, number)
                return
            if not state.roster:  # ending the round takes the members' keys (who is expected back)
                state = self._decodable(self.run.read())
                continue
            incident = self._incident(state, change)
            if incident is None:
                return
            ended = self.run.end_round(state, state.round, incident)  # type: ignore[arg-type]
            if ended:
                self._catch_up(ended)
                return
            state = self.run.read()

    def _store_was_away(self) -> bool:
        """Our own keep-alive or calls failed to reach etcd within the last lease: an outage, not a loss."""
        window = 2.0 * self.config.lease_seconds
        lease = self._member_lease
        seen = [t for t in (self.store.last_unreachable, lease.last_failure if lease else None) if t]
        return any(time.monotonic() - t < window for t in seen)

    def _decodable(self, state: JobState) -> JobState:
        error = state.corruption()
        if error is not None:
            raise error
        if state.round is None:
            # The run's keys all hang on its job lease: they went together (no agent kept it alive for its
            # TTL, e.g. etcd was unreachable that long, or someone deleted them). Nothing of the run is left
            # to rejoin; starting afresh is the operator's call, not a guess of ours.
            raise RendezvousClosedError(
                f"the run of job {self.run.keys.namespace}/{self.run.keys.name} is gone from etcd (its keys "
                "lapsed with the job lease or were deleted): start the job again"
            )
        return state

    def _own_failure(self) -> Failure:
        return self._worker_failure or Failure(None, member=self.member_id, at=time.time())

    def _settle(self, number: int) -> JobState:
        """Wait until every member of the round reported, the round ended, or `settle_seconds` passed."""
        assert self._view is not None
        deadline = time.monotonic() + self.config.settle_seconds
        while True:
            state = self.run.read()
            current = state.round
            heard = state.heard_from() if self.settle_until_heard else frozenset(state.failures)
            if not _is_current(state, number) or (current and set(current.members) <= heard):
                return state
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return state
            self._view.wait_for_change(state.revision, timeout=remaining)

    def _answer_incidents(self) -> None:
        """Answer a peer's failure report in the round this agent trains in, at once, from this thread.

        torch's agent may not notice the failure for a while (its workers can be mid-step), but the answer
        tells whoever ends the round that this member is alive and will be back, so the next round waits
        for it, and for nobody who stayed silent (a lost node), instead of waiting out the last call. Where
        our own worker failed as well, the answer is its report: the peer settling the incident then weighs
        our exit code (e.g. our crash broke its group while etcd was away, and its report only names a loss).
        """
        view = self._view
        assert view is not None
        answered: int | None = None
        revision = 0
        while not self._shut_down:
            changed = view.wait_for_change(revision, timeout=5.0)  # woken by any change, and by close
            if not view.following:
                time.sleep(0.5)  # state() now reads etcd: poll gently
            elif not changed:
                continue
            revision = view.revision
            with self._lock:
                joined = self._joined.number if self._joined is not None else None
                lease, own = self._member_lease, self._worker_failure
            if joined is None or joined == answered:
                continue  # not training (joining, or answered already): nothing to parse
            state = view.state()
            if not _is_current(state, joined) or not state.failures:
                continue
            if self.member_id not in state.heard_from() and lease is not None:
                try:
                    if own is not None and own.member == self.member_id:
                        # our worker failed too (its report waits in the agent's loop): say so, not "alive"
                        self.run.report_failure(state, joined, self.member_id, own)
                    else:
                        self.run.answer_incident(joined, self.member_id, lease.lease_id)
                except StoreUnavailableError as err:
                    log.warning("could not answer the incident of round %d: %s", joined, err)
            answered = joined

    def _cost_of_unreported_failure(self, state: JobState, number: int) -> None:
        """Our workers failed in round `number`, which someone else ended first. A permanent failure still
        closes the job; a crash in a round an etcd outage ended (for free) is still charged, once: the
        outage is free, the crash is not; and where our lease lapsed in that outage and a peer charged us as
        lost, our report amends that charge with the real cause (docs/design.md §3.11)."""
        if self._worker_failure is None:
            return
        incident = self.run.incident(state, RoundEnd.WORKER_FAILURE, self._worker_failure)
        after = state.round
        ended_by = after.opened_by if after is not None and after.number == number + 1 else None
        ours = Charge(number, RoundEnd.WORKER_FAILURE.value, "", member=self.member_id)
        charged_as_lost = state.budget is not None and any(
            c.round == number and amends(ours, c) for c in state.budget.charges)
        if incident.action is Action.FAIL_JOB or ended_by == RoundEnd.STORE_UNAVAILABLE or charged_as_lost:
            self.run.cost_after_end(state, number, incident)

    def _incident(self, state: JobState, change: Change | None) -> Incident | None:
        """What ends the round: a change this agent saw, else the first cause of the reported failures."""
        if change is None:
            current = state.round
            assert current is not None
            reports = dict(state.failures) or {self.member_id: self._own_failure()}
            ranked = sorted(current.members, key=current.members.__getitem__)
            silent = silent_members(ranked, state.heard_from() | reports.keys(), state.departed)
            return self.run.incident_from_reports(state, reports, silent)
        if not change.ends_round_itself:
            return None
        if change.reason in FREE_ENDS:
            return Incident(change.reason)
        if change.reason is RoundEnd.MEMBER_LOST:
            return self.run.incident(state, change.reason, Failure(None, reason=NODE_LOST, member=change.member))
        return self.run.incident(state, change.reason, Failure(None, reason=change.reason.value, member=change.member))

    def _join(self) -> Joined:
        assert self._view is not None and self._member_lease is not None
        deadline = time.monotonic() + self.config.join_timeout
        after = self._joined.number if self._joined else None
        gathered: frozenset[str] | None = None
        quiet_since = time.monotonic()
        written: tuple[int, int] | None = None  # (target round, revision) of this member's last key write
        while True:
            if self._member_lease.lost.is_set():  # etcd was unreachable for a whole TTL: start over, keyed anew
                self._regrant()
                written = None
            deciding_since = time.monotonic()
            state = self._decodable(self._lead_if_leaderless(self._view.state()))
            if self._sealer_overdue(state, quiet_since):
                log.warning("round %d is not sealed %.0f s after it went quiet: member %s reads the roster and "
                            "seals it itself", state.round.number if state.round else -1,
                            time.monotonic() - quiet_since, self.member_id)
                self._view.widen()
                continue
            now_gathered = _gathered(state)
            if now_gathered != gathered:
                gathered, quiet_since = now_gathered, time.monotonic()
            step = join_step(state, self.member_id, self.settings, time.monotonic() - quiet_since, after)
            pace = min((time.monotonic() - deciding_since) * SEALER_PACE, SEALER_PACE_MAX_SECONDS)
            if isinstance(step, Joined):
                return step
            if isinstance(step, Refuse):
                raise RendezvousClosedError(f"job closed ({step.reason}): {step.message}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RendezvousTimeoutError(
                    f"member {self.member_id} could not join a round of job {self.run.keys.namespace}/"
                    f"{self.run.keys.name} within {self.config.join_timeout:g} s "
                    f"(need {self.config.min_nodes} to {self.config.max_nodes} members"
                    + (f"; {len(state.members)} present)" if state.roster else f"; sealer {state.sealer})")
                )
            if isinstance(step, Target):
                # Write once, then wait for the view to show it: writing again before it does would only
                # change the key's revision under the others' seal transactions and make them retry.
                if written is None or written[0] != step.round or state.revision >= written[1]:
                    member = self._member(step.round)
                    written = (step.round, self.run.put_member(member, self._member_lease.lease_id))
                    self._view.wrote(self.run.keys.member(self.member_id), dumps(member.to_json()).encode(), written[1])
                self._view.wait_for_change(state.revision, timeout=min(remaining, 1.0))
                self._pace(deciding_since + pace)
            elif isinstance(step, Seal):
                sealed_at = self.run.seal(state, step.round, step.ranks)
                if not sealed_at:
                    self._view.wait_for_change(state.revision, timeout=min(remaining, 0.2))
                else:  # decide again once the view shows the seal, not on an older event (a seal bound to fail)
                    self._view.wait_for_change(sealed_at - 1, timeout=min(remaining, OWN_WRITE_WAIT_SECONDS))
            elif isinstance(step, EndDeadRound):
                self._end_dead_round(state, step.round)
            elif isinstance(step, EndRound):
                self._end_changed_round(state, step)
            elif isinstance(step, Wait):
                wait = remaining if step.seconds is None else min(step.seconds, remaining)
                self._view.wait_for_change(state.revision, timeout=max(min(wait, 1.0), 0.01))
                self._pace(deciding_since + pace)

    def _pace(self, until: float) -> None:
        """The sealer waits until `until` before deciding again, so that the joins arriving meanwhile are decided
        on together: deciding at each of 1,024 joins, a millisecond each, took the CPU its own view needed to
        follow etcd (the seal came seconds after the last join). Others decide on their own keys only."""
        delay = until - time.monotonic()
        if delay > 0 and self._view is not None and self._view.whole:
            time.sleep(delay)

    def _end_dead_round(self, state: JobState, dead: Round) -> None:
        """End a round whose members all vanished: free after a store outage we saw, else one charge."""
        if self._store_was_away():
            incident = Incident(RoundEnd.STORE_UNAVAILABLE)
        else:
            lost = min(dead.members, key=dead.members.__getitem__)
            incident = self.run.incident(state, RoundEnd.MEMBER_LOST, Failure(None, reason=NODE_LOST, member=lost))
        log.warning("round %d has no live member left: ending it (%s)", dead.number, incident.reason.value)
        self._catch_up(self.run.end_round(state, dead, incident))

    def _end_changed_round(self, state: JobState, step: EndRound) -> None:
        """As the sealer outside the round: end it on the change its members cannot see."""
        change = step.change
        if change.reason is RoundEnd.MEMBER_LOST and self._store_was_away():
            change = Change(RoundEnd.STORE_UNAVAILABLE, member=change.member)
        incident = self._incident(state, change)
        if incident is None:
            return
        ended = self.run.end_round(state, step.round, incident)
        if ended:
            self._catch_up(ended)
        else:
            self._view.wait_for_change(state.revision, timeout=0.2)  # type: ignore[union-attr]

    def _catch_up(self, revision: int) -> None:
        """After our own write that ended a round, decide next on a view that shows it: deciding on the older
        state would only end the same round again, a read and a failed transaction each time (at 1,024 members
        the sealer's view can lag its own write by a second)."""
        if revision and self._view is not None:
            self._view.wait_for_change(revision - 1, timeout=OWN_WRITE_WAIT_SECONDS)

    def _member(self, target: int) -> Member:
        return Member(
            id=self.member_id,
            target=target,
            host=socket.gethostname(),
            addr=self.config.local_addr or socket.getfqdn(),
            pid=os.getpid(),
            joined_at=self._joined_at,
            worker=os.environ.get("ELASTIC_WORKER"),
        )

    # --- leaving ---

    def _leave(self, departure: RoundEnd | None) -> None:
        """Take this member out. With a departure reason, others learn it was no loss."""
        with self._lock:
            if self._shut_down:
                return
            self._shut_down = True
        try:
            if self._joined is not None and self._worker_failure is not None:
                self._end_trained_round()
            if departure is not None and self._joined is not None and self._view is not None:
                self.run.depart(self.run.read(), self.member_id, departure.value, self._joined.number)
            if self._member_lease is not None:
                self._member_lease.revoke()
        except StoreUnavailableError as err:
            log.warning("could not leave cleanly (%s); the member key expires with its lease", err)
        finally:
            if self._job_lease is not None:
                self._job_lease.stop()
            if self._view is not None:
                self._view.close()
            self.changes.close()
            if self._owns_store:
                self.store.close()

    def _at_exit(self) -> None:
        """torch skips shutdown() when a signal stops the agent: a stop on purpose, so free by default.

        At exit, etcd gets a short while only: a process ending with etcd gone (a test harness that stopped
        it, a node shutting down) must not hang 15 s per handler; the member key expires with its lease.
        """
        if not self._shut_down and self._view is not None:
            self.store.retry_seconds = min(self.store.retry_seconds, AT_EXIT_RETRY_SECONDS)
            self._leave(RoundEnd.PREEMPTED)


def _is_current(state: JobState, number: int) -> bool:
    """The round `number` is still the sealed, current round."""
    return state.round is not None and state.round.number == number and state.round.sealed


def _gathered(state: JobState) -> frozenset[str]:
    current = state.round
    if current is None or current.sealed:
        return frozenset()
    return frozenset(m.id for m in gathered_for(state, current))


def _first_failure(error: ChildFailedError) -> tuple[int | None, float | None, str | None]:
    """What torch's error says of its first failed worker: exit code, time, its `@record` traceback if any."""
    failure = min(error.failures.values(), key=lambda f: f.timestamp)
    return failure.exitcode, float(failure.timestamp), recorded_error(failure.error_file)
