"""Never two acting leaders: a hypothesis property over Lease electors with skewed clocks, stalls and faults.

The electors are the real `LeaderElector`, driven against the in-memory model of the Lease API
(lease_model.py: the fake API server's resourceVersion/409 rules; test_kube_leader.py runs one script
against both) in simulated time: a hundred examples of a few hundred steps each would take many minutes
over HTTP in real time, and take a few seconds here.

Each replica has its own monotonic clock (an offset of up to ~11 days, a rate within ±10%) and wall clock
(up to a day off: it is only written into renewTime, which must not matter). Its renew thread is a real
thread, stepped once per retry period of its own clock by a deterministic scheduler in simulated time: a
call in flight lets the others run, so one replica's read lands while another's write is on its way, as on
the wire. Chaos, drawn per step: the renew thread stalls (up to three lease durations, then resumes), or
its calls take time (up to about a lease duration before and after they take effect) and fail (refused,
answer lost after the write landed, or a stale read).

Checked after every event, which covers every instant that matters (a replica starts acting only when a
step ends; otherwise acting only ends, by its clock): at most one replica acts, and it is the Lease's
holder. Then, with a healthy API server: some replica leads; its renewals stall past the lease; another
replica leads within a lease and two retry periods (of the slowest clock), and the stalled one, resumed,
does not act. The property fails, as it should, for an elector that trusts the holder's renewTime, counts
its renew deadline from the end of a write instead of its start, or has a deadline close to the lease.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st
from lease_model import Call, Fault, MemoryLeases, SimTime

from elastic.controller.machinery.lease_election import LEASE_NAME, LeaderElector

LEASE = 15
RETRY = LEASE / 5
SLOWEST = 0.9  # the slowest clock rate drawn: bounds how long (in true time) a lease duration can last

LATENCIES = st.sampled_from([0.0, 0.0, 0.0, 0.1, 1.0, RETRY, 9.0, 14.0])
READS = st.builds(Call, LATENCIES, LATENCIES, st.sampled_from([Fault.NONE] * 4 + [*Fault]))
WRITES = st.builds(Call, LATENCIES, LATENCIES, st.sampled_from([Fault.NONE] * 4 + [Fault.REFUSED, Fault.REPLY_LOST]))
STALLS = st.sampled_from([0.0] * 6 + [RETRY, LEASE / 2, LEASE, LEASE + 1, 3 * LEASE])


@dataclass(frozen=True)
class Chaos:
    """What happens at one scheduled step: the renew thread stalls, or it steps with these two calls."""

    stall: float
    read: Call
    write: Call


@dataclass(frozen=True)
class Host:
    offset: float  # its monotonic clock's zero, in true seconds
    rate: float  # how fast its clocks run
    wall_offset: float  # its wall clock's error


HOSTS = st.builds(
    Host,
    st.floats(-1e6, 1e6, allow_nan=False),
    st.floats(SLOWEST, 1.1, allow_nan=False),
    st.floats(-86400, 86400, allow_nan=False),
)


CHAOS = st.lists(st.builds(Chaos, STALLS, READS, WRITES), min_size=10, max_size=200)


class _Closed(BaseException):
    """Unwinds a renew thread paused in a call when its simulation ends (not an `Exception`: nothing catches it)."""


class Scheduler(SimTime):
    """Simulated time in which each replica's renew thread is a real thread, and only one ever runs.

    A call in flight (`sleep`) hands control back; the scheduler then runs whatever is due next, another
    replica's step or another call's progress. Calls thus overlap in simulated time as they would on the
    wire (a replica reads while another's write is on its way), and every run is deterministic.
    """

    def __init__(self) -> None:
        super().__init__()
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self.handed_back = threading.Semaphore(0)
        self.running: RenewThread | None = None

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._due, (when, next(self._order), action))

    def next_due(self) -> float:
        return self._due[0][0]

    def run_next(self) -> None:
        when, _, action = heapq.heappop(self._due)
        self.now = max(self.now, when)
        action()

    def sleep(self, seconds: float) -> None:
        thread = self.running
        assert thread is not None, "only a renew thread makes calls"
        self.at(self.now + seconds, thread.resume)
        thread.pause()


class RenewThread:
    """One replica's renew thread: runs `step` when the scheduler begins it, pauses in every call."""

    def __init__(self, scheduler: Scheduler, step: Callable[[], None]) -> None:
        self.scheduler = scheduler
        self.step = step
        self.busy = False
        self.closed = False
        self.error: BaseException | None = None
        self._go = threading.Semaphore(0)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._go.acquire()
            if self.closed:
                return
            try:
                self.step()
            except _Closed:
                return
            except BaseException as err:  # handed to the scheduler's thread, which fails the test with it
                self.error = err
            self.busy = False
            self.scheduler.handed_back.release()

    def begin(self) -> None:
        self.busy = True
        self.resume()

    def resume(self) -> None:
        """On the scheduler's thread: let this thread run until it pauses in a call or ends its step."""
        self.scheduler.running = self
        self._go.release()
        self.scheduler.handed_back.acquire()
        self.scheduler.running = None
        if self.error is not None:
            raise self.error

    def pause(self) -> None:
        """On this thread, in a call: hand control back until the call's time has come."""
        self.scheduler.handed_back.release()
        self._go.acquire()
        if self.closed:
            raise _Closed

    def close(self) -> None:
        self.closed = True
        self._go.release()
        self._thread.join(timeout=5)


class Replica:
    def __init__(self, sim: Simulation, name: str, host: Host) -> None:
        self.name = name
        self.rate = host.rate
        clock, wall = sim.time.clock(host.offset, host.rate), sim.time.clock(1.7e9 + host.wall_offset, host.rate)
        self.elector = LeaderElector(sim.api, "elastic-system", name, LEASE, clock=clock, wall=wall)
        self.calls: list[Call] = []  # what the calls of the step in progress meet
        self.stalled_until = 0.0
        self.thread = RenewThread(sim.time, lambda: sim.step(self))


class Simulation:
    def __init__(self, hosts: list[Host], chaos: list[Chaos]) -> None:
        self.time = Scheduler()
        self.api = MemoryLeases(self.time, plan=self._plan)
        self.chaos = list(chaos)
        self.replicas = [Replica(self, f"replica-{i}", host) for i, host in enumerate(hosts)]
        self.log: list[str] = []
        for replica in self.replicas:
            self.time.at(0.0, lambda r=replica: self.tick(r))

    def _plan(self, verb: str) -> Call:
        replica = next(r for r in self.replicas if r.thread is self.time.running)
        return replica.calls.pop(0) if replica.calls else Call()

    def tick(self, replica: Replica) -> None:
        """The replica's renew thread wakes up: it steps, unless it is stalled (then it wakes up later)."""
        now = self.time.now
        event = self.chaos.pop(0) if self.chaos else None
        if event is not None and event.stall:
            replica.stalled_until = now + event.stall
            self.log.append(f"{now:.3f} {replica.name} stalls until {replica.stalled_until:.3f}")
        if now < replica.stalled_until:
            self.time.at(replica.stalled_until, lambda: self.tick(replica))
            return
        replica.calls = [event.read, event.write] if event is not None else []
        self.log.append(f"{now:.3f} {replica.name} steps: {replica.calls}")
        replica.thread.begin()

    def step(self, replica: Replica) -> None:
        """On the replica's renew thread: one pass, then the next one a retry period (its clock) later."""
        acting = replica.elector.step()
        self.log.append(f"{self.time.now:.3f} {replica.name} stepped, acting={acting}")
        self.time.at(self.time.now + RETRY / replica.rate, lambda: self.tick(replica))

    def holder(self) -> str | None:
        lease = self.api.objects.get(("elastic-system", LEASE_NAME))
        return lease["spec"]["holderIdentity"] if lease else None

    def acting(self) -> list[Replica]:
        return [r for r in self.replicas if r.elector.acting]

    def check(self) -> None:
        acting = self.acting()
        trace = "\n".join(self.log[-30:])
        assert len(acting) <= 1, f"two acting at {self.time.now:.3f}: {[r.name for r in acting]}\n{trace}"
        if acting:
            assert acting[0].name == self.holder(), f"{acting[0].name} acts, {self.holder()} holds\n{trace}"

    def run_until(self, done: Callable[[], object], deadline: float) -> bool:
        """Run what is due, checking after each event, until `done()`; False if it is not by `deadline`."""
        while not done():
            if self.time.next_due() > deadline:
                return False
            self.time.run_next()
            self.check()
        return True

    def settled(self) -> bool:
        """No call in flight and no stall pending."""
        return all(not r.thread.busy and self.time.now >= r.stalled_until for r in self.replicas)

    def close(self) -> None:
        for replica in self.replicas:
            replica.thread.close()


@settings(max_examples=100, deadline=None)
@given(hosts=st.lists(HOSTS, min_size=2, max_size=3), chaos=CHAOS)
def test_never_two_acting_leaders_and_a_stalled_leader_is_replaced(hosts: list[Host], chaos: list[Chaos]) -> None:
    sim = Simulation(hosts, chaos)
    try:
        assert sim.run_until(lambda: not sim.chaos, deadline=math.inf)

        # A healthy API server: once the last call and stall are over, someone leads within a lease and two
        # retry periods.
        assert sim.run_until(sim.settled, deadline=math.inf)
        settled = sim.time.now
        assert sim.run_until(sim.acting, settled + (LEASE + 2 * RETRY) / SLOWEST + 1), sim.log[-10:]
        leader = sim.acting()[0]

        # The leader's renewals stall past its lease: another replica leads; the stalled one, resumed, does not.
        stalled_at = sim.time.now
        leader.stalled_until = resumes = stalled_at + 3 * LEASE
        others_lead = lambda: any(r is not leader for r in sim.acting())  # noqa: E731
        assert sim.run_until(others_lead, stalled_at + (LEASE + 2 * RETRY) / SLOWEST + 1), sim.log[-10:]
        assert sim.run_until(lambda: sim.time.now > resumes + RETRY, resumes + 2 * RETRY)
        assert not leader.elector.acting and sim.holder() != leader.name
    finally:
        sim.close()
