"""Hot recovery side by side (`bench/recovery.py --hot`): in-place recovery, restart mode and c10d.

One job of `examples/train_inplace.py` (gloo on CPU, 1 worker per agent, `--hidden 3536` by default: 100 MB
of parameters and SGD momentum) per variant and size; in it, in turn, incidents of each scenario:

  worker_crash  SIGKILL one worker, agents live -> first committed step of the new round at full size
  node_loss     SIGKILL one whole agent with its worker -> first committed step of the survivors' round
                (the victim is neither rank 0's agent nor the c10d store host)
  scale_up      launch one more agent (the lost one's replacement) -> first committed step at full size
  spare_takeover  a spare waits (the job is at its maximum), SIGKILL one whole agent -> first committed step
                at full size, the spare in the lost agent's place (in jobs N:N; etcd-v3 variants; not the default)

Variants, taking turns (a block of incidents each, `--blocks` times): `in-place` (`elastic agent
--recovery=in-place`: survivors keep their processes, a replacement is a warm fork and gets the state from a
peer), `restart` (`elastic agent`: torch's agent on etcd-v3, every worker restarted and resumed from the
checkpoint rank 0 saves), `c10d-tuned` and `c10d-defaults` (stock torchrun, checkpoint as for restart). Peers
in the same turns, worker crashes only: `torchft`, `torchft-cold`, `torchft-tuned`, `torchft-tuned-cold` (and
`torchft-ddp` when named), the same model on torchft (bench/peers/torchft_job.py says how; `make bench-peers`
installs it; without it they are skipped with one line).

A time is the fault (the kill, or the launch) -> the `time=` of the first step line of the new round. For
in-place it is cut into consecutive phases (so that they sum to it): detect (fault -> the round record's
`opened_at`), abort (-> the last survivor left its old group), rendezvous (-> `sealed_at`), process group,
state transfer (-> the last rank's `recovered` line, less its own intervals), first step. For every variant
also the stall (the longest gap between committed steps around the fault, what the survivors wait) and the steps
lost (redone after the fault, as a restart from a checkpoint does). An in-place incident
is clean when training goes on in that round with no other failure, and the job ends (`done`) with
applied = step on every rank and equal checksums.
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata
import itertools
import math
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from bench import common
from bench.agentjob import AgentStep, BenchJob, Failure, LogTail
from bench.peers import torchft_job
from elastic.rendezvous.protocol import spares_waiting
from elastic.rendezvous.run import JobRun
from elastic.store import JobKeys, Store
from elastic.store.server import EtcdServer
from harness.agents import torchrun_command

Variant = common.Variant
SCRIPT = common.REPO / "examples" / "train_inplace.py"
AGENT = (common.PYTHON, "-m", "elastic.agent")
BUDGET = {"max_restarts": 1000}  # the bench never spends the job budget
IN_PLACE = Variant("in-place", "etcd-v3", BUDGET, "elastic agent --recovery=in-place (etcd-v3 defaults: lease 10 s)")
RESTART = Variant("restart", "etcd-v3", BUDGET, "elastic agent: torch's agent on etcd-v3, workers restarted, "
                  "resumed from the checkpoint")
C10D_TUNED = Variant("c10d-tuned", "c10d", {"last_call_timeout": common.EQUAL_LAST_CALL_SECONDS,
                                            "keep_alive_interval": 1, "keep_alive_max_attempt": 2},
                     "stock torchrun, last_call_timeout=2, keep-alive 1 s x 2")
C10D_DEFAULTS = Variant("c10d-defaults", "c10d", {}, "stock torchrun, torch defaults (last call 30 s, 5 s x 3)")
IN_PLACE_DDP = Variant("in-place-ddp", "etcd-v3", BUDGET, "as in-place, the model in elastic.train."
                       "DistributedDataParallel (DDP's bucketed all-reduce, then the commit gate's one number)")
IN_PLACE_HSDP = Variant("in-place-hsdp", "etcd-v3", BUDGET, "as in-place, the model fully_shard()ed (FSDP2) over "
                        "replicas of 2 agents, the replicas averaged (HSDP 2 x N/2); worker crashes at 4+ agents only")
IN_PLACE_KINDS = (IN_PLACE, IN_PLACE_DDP, IN_PLACE_HSDP)  # jobs that run a known number of steps, end with `done`
VARIANTS = {v.name: v for v in (IN_PLACE, IN_PLACE_DDP, IN_PLACE_HSDP, RESTART, C10D_TUNED, C10D_DEFAULTS)}
LAUNCHERS = {**{v.name: (*AGENT, "--recovery=in-place") for v in IN_PLACE_KINDS}, RESTART.name: AGENT}
HSDP_SHARD = 2  # ranks per replica in the in-place-hsdp variant
SCENARIOS = ("worker_crash", "node_loss", "scale_up", "spare_takeover")
DEFAULT_SCENARIOS = SCENARIOS[:3]
PHASES = ("detect", "abort", "rendezvous", "process_group", "state_transfer", "first_step")
VARIANTS |= {v.name: v for v in torchft_job.VARIANTS}  # peers (bench/peers/torchft_job.py), in the same turns
STEADY_STEPS = 10
STEPS_PER_INCIDENT = 25  # in-place jobs run a known number of steps, so that they end with `done` lines
STALL_STEPS = 5  # the stall is looked for up to this many committed steps at full size after the recovery
LEASE_SECONDS = 10.0  # etcd-v3's default lease_seconds

RECOVERED = re.compile(r"^recovered round=(\d+) rank=(\d+) world_size=(\d+) wait_round=([\d.]+) "
                       r"process_group=([\d.]+) state_transfer=([\d.]+) bytes=(\d+) source=(\d+)(?: pid=\d+)? "
                       r"time=([\d.]+)$")
DONE = re.compile(r"^done step=(\d+) applied=(\d+) checksum=(-?[\d.]+) pid=(\d+)$")
# the in-place agent's report of a failed worker, and a worker's own exit on a hang or an abandoned round
IN_PLACE_FAILED = re.compile(r"local worker\(s\) \[[\d, ]*\] failed \(exit (-?\d+)\)|elastic\.train: rank \d+ exits "
                             r"\((\d+)\)")


@dataclass(frozen=True)
class Recovered:
    """A worker's `recovered` line: when it started joining, got its rank, had a group and the state."""

    agent: int
    generation: int
    round: int
    rank: int
    world_size: int
    wait_round: float
    process_group: float
    state_transfer: float
    bytes: int
    time: float

    @property
    def grouped_at(self) -> float:
        return self.time - self.state_transfer

    @property
    def joined_at(self) -> float:
        return self.grouped_at - self.process_group

    @property
    def started_at(self) -> float:
        return self.joined_at - self.wait_round


@dataclass
class HotTail(LogTail):
    recovered: list[Recovered] = field(default_factory=list)
    done: list[tuple[int, int, float]] = field(default_factory=list)  # step, applied, checksum

    def read(self, line: str, now: float) -> bool:
        if super().read(line, now):
            return True
        if m := RECOVERED.match(line):
            self.recovered.append(Recovered(self.agent, self.generation, int(m[1]), int(m[2]), int(m[3]),
                                            float(m[4]), float(m[5]), float(m[6]), int(m[7]), float(m[9])))
        elif m := DONE.match(line):
            self.done.append((int(m[1]), int(m[2]), float(m[3])))
        elif m := IN_PLACE_FAILED.search(line):
            self.failures.append(Failure(self.agent, int(m[1] or m[2]), 0, now))
        else:
            return False
        return True


class HotJob(BenchJob):
    """A job of `examples/train_inplace.py` under one variant's launcher.

    `launcher` defaults to the variant's (by name, LAUNCHERS; stock torchrun otherwise); bench/churn.py passes
    its own, since its variants (`in-place-spares`) are named differently but launch the same agents.
    """

    def __init__(self, root: Path, variant: Variant, endpoint: str, nnodes: str, script_args: list[str],
                 launcher: Sequence[str] | None = None, label: str = "hot") -> None:
        super().__init__(root, variant.backend, endpoint, nnodes, variant.conf, label=label)
        self.variant = variant
        self.script_args = script_args
        self.launcher = tuple(launcher or LAUNCHERS.get(variant.name, common.TORCHRUN))
        self.tail_type = HotTail
        self.fired = 0  # incidents so far (in place: incident k waits for step (k + 1) x STEPS_PER_INCIDENT)

    def command(self) -> list[str]:
        return torchrun_command(self.endpoint, self.run_id, self.nnodes, self.script_args, conf=self.conf,
                                backend=self.backend, launcher=self.launcher, script=SCRIPT)

    def live(self) -> list[int]:
        return [i for i, agent in enumerate(self.agents) if agent.returncode is None]

    def crash(self, victim: int) -> float:
        """SIGKILL the victim agent's worker (its agent replaces it); returns the fault's time."""
        t = time.time()
        self.agents[victim].kill_worker()
        return t

    def latest_step(self) -> int:
        steps = self.steps()
        return steps[-1].step.step if steps else -1

    def recovered(self, round_number: int) -> list[Recovered]:
        self.poll()
        return [r for t in self.tails for r in t.recovered if r.round == round_number]  # type: ignore[attr-defined]

    def done_lines(self) -> list[tuple[int, int, float]]:
        self.poll()
        return [d for tail in self.tails for d in tail.done]  # type: ignore[attr-defined]


Job = HotJob | torchft_job.TorchftJob  # what bench/hot.py runs: ours (and stock torchrun's), or a torchft job
AnyJob = TypeVar("AnyJob", HotJob, torchft_job.TorchftJob)


@dataclass
class Incident(common.Measurement):
    """A measurement of this benchmark (`repeat`: the block), with its job's size and, in place, its phases."""

    agents: int = 0
    phases: dict[str, float] | None = None
    replacement_in_group: float | None = None  # crash -> the replacement's group was built
    transfer_s: float | None = None  # the receiving rank's state_transfer
    transfer_bytes: int | None = None
    stall_s: float | None = None  # the longest gap between committed steps around the fault (`disruption`)
    steps_lost: int | None = None  # steps committed, then redone (a restart from a checkpoint)


class HotBench:
    def __init__(self, args: argparse.Namespace, etcd: EtcdServer, root: Path) -> None:
        self.args = args
        self.etcd = etcd
        self.store = Store(etcd.client_url)
        self.root = root
        self.rows: list[Incident] = []
        self.failed_logs: list[str] = []
        self.repeat = 0  # the block being run
        self.current: Job | None = None  # the job running now (stopped if the bench is interrupted)

    def record(self, row: Incident) -> None:
        self.rows.append(row)
        value = "none" if row.value is None else f"{row.value:.2f} s"
        clean = "" if row.clean is None else (" clean" if row.clean else " NOT CLEAN")
        common.log(f"{row.scenario:<12} {row.variant:<13} {row.agents} agents: {value}{clean} {row.note}")
        if self.args.out:
            common.write_csv(self.args.out / "hot_runs.csv", [_flat(r) for r in self.rows])

    # --- jobs ---

    def start(self, variant: Variant, size: int, incidents: int, nnodes: tuple[int, int]) -> HotJob | None:
        root = Path(tempfile.mkdtemp(prefix=f"hot-{variant.name}-{size}-", dir=self.root))
        script_args = ["--hidden", str(self.args.hidden), "--step-seconds", str(self.args.step_seconds),
                       "--device", self.args.device, *(["--backend", self.args.backend] if self.args.backend else [])]
        if variant in IN_PLACE_KINDS:
            script_args += ["--steps", str(STEPS_PER_INCIDENT * (incidents + 2))]
            script_args += ["--ddp"] if variant is IN_PLACE_DDP else []
            script_args += ["--hsdp", str(HSDP_SHARD)] if variant is IN_PLACE_HSDP else []
        else:
            script_args += ["--steps", "1000000", "--checkpoint-dir", str(root / "checkpoints"),
                            "--checkpoint-every", str(self.args.checkpoint_every)]
        endpoint = self.etcd.client_url if variant.backend == "etcd-v3" else f"127.0.0.1:{common.free_port()}"
        return self.steady(HotJob(root, variant, endpoint, f"{nnodes[0]}:{nnodes[1]}", script_args), size)

    def start_torchft(self, variant: Variant, size: int) -> torchft_job.TorchftJob | None:
        """A torchft job trains until stopped, without checkpoints: a peer heals a newcomer."""
        root = Path(tempfile.mkdtemp(prefix=f"hot-{variant.name}-{size}-", dir=self.root))
        try:
            job = torchft_job.TorchftJob(root, variant, self.args.hidden, self.args.step_seconds,
                                         self.args.start_timeout)
        except RuntimeError as err:  # its lighthouse did not start
            common.log(f"{variant.name} {size} agents: {err}")
            self.failed_logs.append(str(root))
            return None
        return self.steady(job, size)

    def steady(self, job: AnyJob, size: int) -> AnyJob | None:
        """`size` members started, training steadily at full size; None (logged, stopped) if they never did."""
        self.current = job
        t0 = time.time()
        for _ in range(size):
            job.add()
        if job.wait_steady(size, t0, STEADY_STEPS, self.args.start_timeout):
            job.fired = 0
            return job
        common.log(f"{job.variant.name} {size} agents: the job never trained at size {size}\n{job.tail_text()}")
        self.close(job, False)
        return None

    def close(self, job: Job, ok: bool) -> None:
        job.stop()
        self.current = None
        if not ok:
            self.failed_logs.append(str(job.root))
        elif not self.args.keep_logs:
            shutil.rmtree(job.root, ignore_errors=True)

    def block(self, variant: Variant, size: int, crashes: int, losses: int) -> None:
        """`crashes` worker crashes in full-size jobs (nnodes N:2N, unless --crash-min-one), then `losses` times
        node loss and scale-up in turn, in jobs that may shrink (1:2N), then `losses` spare takeovers in jobs at
        their maximum (N:N), for the scenarios asked for and the variant can run."""
        crash_min = 1 if self.args.crash_min_one else size
        crash = [s for s in self.args.scenarios if s == "worker_crash"]
        loss = [s for s in self.args.scenarios if s in ("node_loss", "scale_up")]
        spare = [s for s in self.args.scenarios if s == "spare_takeover"]
        if variant.backend != "etcd-v3":  # a waiting spare is read from the etcd-v3 record; torchft: crashes only
            spare = []
        if variant.backend == torchft_job.BACKEND:  # worker crashes only (torchft_job.SCENARIOS)
            loss = []
        if variant is IN_PLACE_HSDP:  # a crash's shard needs a replica (4+ agents); a lost node leaves a half one
            loss = spare = []
            crash = crash if size >= 2 * HSDP_SHARD and size % HSDP_SHARD == 0 else []
        for scenarios, count, nnodes in ((crash, crashes, (crash_min, 2 * size)), (loss, losses, (1, 2 * size)),
                                         (spare, losses, (size, size))):
            self.jobs(variant, size, [s for _ in range(count) for s in scenarios], nnodes)

    def jobs(self, variant: Variant, size: int, events: list[str], nnodes: tuple[int, int]) -> None:
        """These incidents, in as few jobs as will do, of `nnodes` (min, max) agents."""
        while events:
            # a spare's start takes steps of its own before its incident: its jobs get room for three
            room = len(events) * (3 if "spare_takeover" in events else 1)
            job = (self.start_torchft(variant, size) if variant.backend == torchft_job.BACKEND
                   else self.start(variant, size, room, nnodes))
            if job is None:
                for scenario in events:
                    self.record(self.failed(scenario, variant, size, "the job never started"))
                return
            mine: list[Incident] = []
            ok = True
            while events and ok and self.room(job, size):
                row = self.incident(job, variant, size, events.pop(0))
                self.record(row)
                mine.append(row)
                ok = row.value is not None
            ok = self.finish(job, mine) and ok
            self.close(job, ok and all(r.clean is not False for r in mine))

    def room(self, job: Job, size: int) -> bool:
        """In-place jobs end after a known number of steps: is there room for one more incident?"""
        return job.variant not in IN_PLACE_KINDS or job.latest_step() + STEPS_PER_INCIDENT <= self.total_steps(job)

    @staticmethod
    def total_steps(job: HotJob) -> int:
        return int(job.script_args[job.script_args.index("--steps") + 1])

    def finish(self, job: Job, rows: list[Incident]) -> bool:
        """In place: let the job end, then check every rank's `done` line (applied = step, same checksum)."""
        if job.variant not in IN_PLACE_KINDS:
            return True
        total = self.total_steps(job)
        size = len([agent for agent in job.agents if agent.returncode != -9])  # all but those killed here
        ended = job.wait_for(lambda: len(job.done_lines()) >= size, self.args.timeout + total)
        done = job.done_lines()
        good = bool(ended) and all(step == total and applied == total for step, applied, _ in done) and len(
            {round(c, 3) for _, _, c in done}) == 1
        if not good:
            common.log(f"in-place job end NOT clean: done lines {done} (want {size} x step={total})\n{job.tail_text()}")
        for row in rows:
            if row.clean:
                row.clean = good
            if not good:
                row.note += f"; job end: done lines {done}, want {size} x step=applied={total} and one checksum"
        if self.args.out:
            common.write_csv(self.args.out / "hot_runs.csv", [_flat(r) for r in self.rows])
        return good

    # --- one incident ---

    def incident(self, job: Job, variant: Variant, size: int, scenario: str) -> Incident:
        want_live = size - 1 if scenario == "scale_up" else size
        if not self.prepare(job, want_live):
            return self.failed(scenario, variant, size, f"the job did not train at {want_live} agents")
        spare: int | None = None
        if scenario == "spare_takeover":
            spare = len(job.agents)
            job.add()  # the job is at its maximum: the new agent waits outside the round
            if not job.wait_for(lambda: self.spare_waits(job), self.args.timeout):
                return self.failed(scenario, variant, size, "the spare never waited outside the round")
        if variant in IN_PLACE_KINDS:  # space the incidents by steps: each job ends at a known step
            job.fired += 1
            job.wait_for(lambda: job.latest_step() >= job.fired * STEPS_PER_INCIDENT, self.args.timeout)
        known = job.round_keys()
        before_pids = job.worker_pids()
        logged = set(job.failures())
        live = job.live()
        victim: int | None = None
        added: int | None = None
        if scenario == "worker_crash":
            victim = live[len(self.rows) % len(live)]
            try:
                t = job.crash(victim)
            except RuntimeError as err:  # no worker to kill, or (torchft) no spare ready: nothing was measured
                return self.failed(scenario, variant, size, str(err))
            want, agents = size, None
        elif scenario in ("node_loss", "spare_takeover"):
            protected = job.store_host() if variant.backend == "c10d" else job.rank0_agent()
            victim = max(i for i in live if i not in (protected, spare))
            t = time.time()
            job.agents[victim].kill()
            want, agents = (size - 1, set(live) - {victim}) if scenario == "node_loss" else (size, None)
        else:
            added = len(job.agents)
            t = time.time()
            job.add()
            want, agents = size, None

        def outcome() -> AgentStep | str | None:
            if added is not None and job.agents[added].returncode is not None:
                return f"the new agent exited ({job.agents[added].returncode})"
            return job.first_new_round_step(t, want, known, agents)

        got = job.wait_for(outcome, self.args.timeout)
        if not isinstance(got, AgentStep):
            note = got or f"no recovery within {self.args.timeout:g} s"
            common.log(f"{scenario} {variant.name}: {note}\n{job.tail_text()}")
            return self.failed(scenario, variant, size, note)
        row = Incident(scenario, variant.name, self.repeat, got.step.time - t, agents=size,
                       note=f"victim agent{victim}" if victim is not None else f"added agent{added}")
        if variant in IN_PLACE_KINDS:
            self.breakdown(job, row, t, got, scenario, victim, known)
        steady = job.wait_steady(want, got.step.time, STEADY_STEPS, self.args.timeout)
        later = job.first_new_round_step(got.step.time, want, known | {got.round_key})
        between = sorted({s.step.world_size for s in job.steps() if t < s.step.time < got.step.time
                          and s.round_key not in known})
        new = [f for f in job.failures() if f not in logged]  # (listed agent by agent, not in time order)
        extra = _extra_failures(new, before_pids, victim if scenario == "worker_crash" else None)
        # torchft's survivors train on without the victim, and a newcomer sits out the step it heals in: by design
        row.clean = steady and later is None and not extra and (not between or variant.backend == torchft_job.BACKEND)
        row.stall_s, row.steps_lost = disruption(job.steps(), t, got, want)
        if between:
            row.note += f"; trained first in a round of world size {', '.join(map(str, between))}"
        if extra:
            row.note += "; other failures: " + ", ".join(f"agent{f.agent} exit {f.exit_code}" for f in extra)
        if later is not None:
            row.note += "; another round before training steadily"
        if not steady:
            row.note += f"; fewer than {STEADY_STEPS} steps after the recovery"
        return row

    def spare_waits(self, job: Job) -> bool:
        """An agent waits outside the sealed round (the etcd-v3 backend's record says so)."""
        return spares_waiting(JobRun(self.store, JobKeys.parse(job.run_id)).read()) >= 1

    def failed(self, scenario: str, variant: Variant, size: int, note: str) -> Incident:
        return Incident(scenario, variant.name, self.repeat, None, False, note, agents=size)

    def prepare(self, job: Job, want_live: int) -> bool:
        """Bring the job to `want_live` agents, training steadily (unmeasured); False if it does not."""
        if any(agent.returncode not in (None, -9) for agent in job.agents):
            return False  # an agent exited by itself (not killed here): the job ended or failed
        while len(job.live()) < want_live:
            job.add()
        while len(job.live()) > want_live:
            job.agents[max(job.live())].kill()
        return job.wait_steady(want_live, time.time(), 3, self.args.timeout)

    def breakdown(self, job: HotJob, row: Incident, t: float, got: AgentStep, scenario: str, victim: int | None,
                  known: set[tuple[int, int, int]]) -> None:
        """The in-place phases of one incident, consecutive, from the round record and the `recovered` lines."""
        record = self.store.get_json(JobKeys.parse(job.run_id).round) or {}
        lines = job.recovered(got.step.restart)
        if record.get("round") != got.step.restart or not record.get("sealed_at") or not lines:
            row.note += f"; no phases (round record {record.get('round')}, {len(lines)} recovered lines)"
            return
        old = {(a, g) for a, g, _ in known}
        survivors = [r for r in lines if (r.agent, r.generation) in old]
        newcomers = [r for r in lines if (r.agent, r.generation) not in old]
        points = [t, float(record["opened_at"]), max((r.started_at for r in survivors), default=t),
                  float(record["sealed_at"]), max(r.grouped_at for r in lines), max(r.time for r in lines),
                  got.step.time]
        for i in range(1, len(points)):  # consecutive by construction: each point no earlier than the one before
            points[i] = max(points[i], points[i - 1])
        row.phases = {name: points[i + 1] - points[i] for i, name in enumerate(PHASES)}
        if newcomers:
            receiver = max(newcomers, key=lambda r: r.bytes)
            row.replacement_in_group = receiver.grouped_at - t
            row.transfer_s, row.transfer_bytes = receiver.state_transfer, receiver.bytes


def disruption(steps: list[AgentStep], t: float, got: AgentStep, want: int) -> tuple[float, int]:
    """(stall, steps lost) of one incident, from the committed steps the job printed (one printer per round).

    The stall is the longest gap between consecutive committed steps, from the last one before the fault to the
    STALL_STEPS-th at full size from the recovery on: what the survivors waited, whoever recovers how. Steps lost:
    the most by which a step number went back (steps redone from a checkpoint), 0 while numbers only go up.
    """
    before = [s for s in steps if s.step.time <= t]
    full = [s for s in steps if s.step.time >= got.step.time and s.step.world_size == want][:STALL_STEPS]
    window = before[-1:] + [s for s in steps if t < s.step.time <= full[-1].step.time]
    times = [s.step.time for s in window]
    stall = max((b - a for a, b in itertools.pairwise(times)), default=0.0)
    lost, high = 0, max((s.step.step for s in before), default=-1)
    for s in window[len(before[-1:]):]:
        lost, high = max(lost, high - s.step.step + 1), max(high, s.step.step)
    return stall, lost


def _extra_failures(new: list[Failure], before_pids: set[int], victim: int | None) -> list[Failure]:
    """Failures after the fault other than the victim's own (in place: its agent's one report)."""
    extra, allowed = [], victim is not None
    for f in new:
        if f.pid and f.pid in before_pids:  # a worker of the round the fault ended (torch's agents log those)
            continue
        if not f.pid and allowed and f.agent == victim:
            allowed = False
            continue
        extra.append(f)
    return extra


def _flat(row: Incident) -> dict[str, object]:
    data = dict(row.__dict__)
    phases = data.pop("phases") or {}
    return data | {f"phase_{k}": phases.get(k) for k in PHASES}


# --- the report ---------------------------------------------------------------------------------


def p90(values: list[float]) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]


def incidents_of(rows: list[Incident], scenario: str, variant: str, agents: int | None = None) -> list[Incident]:
    """One variant's incidents of one scenario, at one size (None: every size)."""
    return [r for r in rows if r.scenario == scenario and r.variant == variant
            and (agents is None or r.agents == agents)]


def values(rows: list[Incident], scenario: str, variant: str, agents: int | None = None) -> list[float | None]:
    return [r.value for r in incidents_of(rows, scenario, variant, agents)]


def censored(found: list[float | None], timeout: float) -> list[float]:
    """A recovery that never came counts as the timeout: a lower bound, so a median stays one too."""
    return [timeout if v is None else v for v in found]


def result_line(rows: list[Incident], scenario: str, agents: int | None, timeout: float,
                variant: Variant = IN_PLACE) -> str:
    name = scenario if agents is None else f"{scenario}_{agents}_agents"
    name = name if variant is IN_PLACE else f"{variant.name.removeprefix('in-place-')}_{name}"
    mine = incidents_of(rows, scenario, variant.name, agents)
    got = censored([r.value for r in mine], timeout)
    median = statistics.median(got) if got else math.nan
    restart = common.Summary.of(censored(values(rows, scenario, RESTART.name, agents), timeout)).median
    c10d = common.Summary.of(censored(values(rows, scenario, C10D_DEFAULTS.name, agents), timeout)).median
    clean = sum(1 for r in mine if r.clean)
    return (f"RESULT hot_{name}_recovery_s median={common.number(median)} p90={common.number(p90(got))} "
            f"restart={common.number(restart)} c10d_defaults={common.number(c10d)} "
            f"ratio_vs_restart={common.number(common.ratio(restart, median), 2)} "
            f"ratio_vs_c10d={common.number(common.ratio(c10d, median), 2)} clean={clean}/{len(mine)}")


def only_abandoned(row: Incident) -> bool:
    """Not clean only because survivors left a collective that could not finish (exit 86, restarted free)."""
    if row.clean is not False or row.value is None or "other failures: " not in row.note:
        return False
    others = row.note.split("other failures: ", 1)[1]
    codes = re.findall(r"exit (-?\d+)", others.split(";")[0])
    return bool(codes) and set(codes) == {"86"} and ";" not in others


def report(args: argparse.Namespace, rows: list[Incident], variants: list[Variant]) -> list[str]:
    out = ["\n## Variants", common.table(["variant", "settings"], [(v.name, v.description) for v in variants])]
    out.append("\n## Fault -> first committed step of the new round, seconds: median [min-max] n, clean/n")
    table_rows = []
    for scenario in args.scenarios:
        for size in args.sizes:
            cells = [scenario, str(size)]
            for v in variants:
                mine = [r for r in rows if (r.scenario, r.variant, r.agents) == (scenario, v.name, size)]
                cell = common.Summary.of(r.value for r in mine).text(2)
                if mine and v in IN_PLACE_KINDS:
                    cell += f", p90 {common.number(p90([r.value for r in mine if r.value is not None]), 2)}"
                if mine:
                    cell += f", {sum(1 for r in mine if r.clean)}/{len(mine)} clean"
                    abandoned = sum(1 for r in mine if only_abandoned(r))
                    if abandoned:
                        cell += f" (+{abandoned} where only survivors abandoned their collective, exit 86)"
                cells.append(cell)
            table_rows.append(cells)
    out.append(common.table(["scenario", "agents", *(v.name for v in variants)], table_rows))
    out += phase_report(args, rows)
    out += peer_report(args, rows, variants)
    unclean = [r for r in rows if r.clean is False]
    if unclean:
        out.append("\n## Not clean")
        out.append(common.table(["scenario", "variant", "agents", "seconds", "what"],
                                [(r.scenario, r.variant, r.agents, common.number(r.value, 2) if r.value else "none",
                                  r.note) for r in unclean]))
    out.append(f"\nIn RESULT lines a recovery that never came counts as the timeout, {args.timeout:g} s (a lower "
               "bound); median and p90 are in-place's, restart and c10d_defaults those variants' medians.\n")
    for variant in (v for v in IN_PLACE_KINDS if v in variants):
        for scenario in args.scenarios:
            out.append(result_line(rows, scenario, None, args.timeout, variant))
            if len(args.sizes) > 1:
                out += [result_line(rows, scenario, size, args.timeout, variant) for size in args.sizes]
    return out


def peer_report(args: argparse.Namespace, rows: list[Incident], variants: list[Variant]) -> list[str]:
    """Every variant's stall and steps lost; with torchft measured, RESULT lines for in-place against it."""
    out = ["\n## Survivors' stall (longest gap between committed steps around the fault), s, and steps lost (redone): "
           "median [max]"]
    table_rows = []
    for scenario in args.scenarios:
        for size in args.sizes:
            cells = [scenario, str(size)]
            for v in variants:
                mine = [r for r in rows if (r.scenario, r.variant, r.agents) == (scenario, v.name, size)
                        and r.stall_s is not None]
                if v.backend == torchft_job.BACKEND and scenario not in torchft_job.SCENARIOS:
                    cells.append("not measured")
                elif not mine:
                    cells.append("—")
                else:
                    stalls, lost = [r.stall_s for r in mine], [r.steps_lost or 0 for r in mine]
                    cells.append(f"{_median_max(stalls)}; lost {statistics.median(lost):g} [{max(lost)}]")
            table_rows.append(cells)
    out.append(common.table(["scenario", "agents", *(v.name for v in variants)], table_rows))
    if not any(v.backend == torchft_job.BACKEND for v in variants):
        return out
    out.append(f"\nIn the RESULT ..._vs_torchft lines median, stall_s (median) and steps_lost (the most in one "
               f"incident) are in-place's; torchft is {torchft_job.REFERENCE.name}'s median, a recovery that never "
               f"came counted as {args.timeout:g} s; ratio_vs_torchft above 1: in-place recovers faster.")
    for scenario in (s for s in args.scenarios if s in torchft_job.SCENARIOS):
        out.append(torchft_line(rows, scenario, None, args.timeout))
        if len(args.sizes) > 1:
            out += [torchft_line(rows, scenario, size, args.timeout) for size in args.sizes]
    return out


def torchft_line(rows: list[Incident], scenario: str, agents: int | None, timeout: float) -> str:
    name = scenario if agents is None else f"{scenario}_{agents}_agents"
    ours = incidents_of(rows, scenario, IN_PLACE.name, agents)
    theirs = incidents_of(rows, scenario, torchft_job.REFERENCE.name, agents)
    median = common.Summary.of(censored([r.value for r in ours], timeout)).median
    torchft = common.Summary.of(censored([r.value for r in theirs], timeout)).median

    def stall(found: list[Incident]) -> str:
        return common.number(common.Summary.of(r.stall_s for r in found).median)

    def lost(found: list[Incident]) -> str:
        counts = [r.steps_lost for r in found if r.steps_lost is not None]
        return str(max(counts)) if counts else "nan"

    return (f"RESULT hot_{name}_vs_torchft median={common.number(median)} torchft={common.number(torchft)} "
            f"ratio_vs_torchft={common.number(common.ratio(torchft, median), 2)} stall_s={stall(ours)} "
            f"steps_lost={lost(ours)} torchft_stall_s={stall(theirs)} torchft_steps_lost={lost(theirs)}")


def phase_report(args: argparse.Namespace, rows: list[Incident]) -> list[str]:
    out = ["\n## In-place phases, seconds (median per phase; sum = total for every incident, checked within 5 %)"]
    table_rows = []
    for variant, scenario, size in ((v, sc, n) for v in IN_PLACE_KINDS for sc in args.scenarios for n in args.sizes):
        mine = [r for r in rows if (r.scenario, r.variant, r.agents) == (scenario, variant.name, size)
                and r.phases and r.value]
        if not mine:
            continue
        medians = [statistics.median(r.phases[p] for r in mine) for p in PHASES]  # type: ignore[index]
        summed = sum(medians)
        total = statistics.median(r.value for r in mine)  # type: ignore[misc]
        within = sum(1 for r in mine if abs(sum(r.phases.values()) - r.value) <= 0.05 * r.value)  # type: ignore
        table_rows.append([variant.name, scenario, str(size), *(f"{m:.3f}" for m in medians), f"{summed:.3f}",
                           f"{total:.3f}", f"{within}/{len(mine)}"])
    out.append(common.table(["variant", "scenario", "agents", *PHASES, "sum of medians", "median total",
                             "sum = total ±5 %"], table_rows))
    crash = [r for r in rows if r.variant == IN_PLACE.name and r.replacement_in_group is not None]
    loss = [r.value for r in rows if r.variant == IN_PLACE.name and r.scenario == "node_loss" and r.value]
    checks = []
    if crash:
        joined = [r.replacement_in_group for r in crash if r.scenario == "worker_crash"]
        if joined:
            checks.append(("worker crash: the warm replacement in the new group, s after the crash (target <= 1)",
                           _median_max(joined)))
        moved = [(r.transfer_s, r.transfer_bytes) for r in crash if r.transfer_bytes]
        if moved:
            mb = statistics.median(b for _, b in moved) / 1e6
            checks.append((f"state transfer to the receiving rank, s, {mb:.0f} MB (target <= 0.5 for 100 MB)",
                           _median_max([s for s, _ in moved])))
    if loss:
        checks.append((f"node loss, s (target <= lease {LEASE_SECONDS:g} + 1)", _median_max(loss)))
    paused = [r.value - r.phases["detect"] for r in rows if r.variant == IN_PLACE.name and r.scenario == "scale_up"
              and r.value and r.phases]
    if paused:  # the newcomer's own start (detect) costs the survivors nothing: they train meanwhile
        checks.append(("scale-up: training paused, s (the newcomer in the round -> first step at full size; "
                       "target <= 1.5)", _median_max(paused)))
    if checks:
        out.append("\n" + common.table(["in-place check", "median [max]"], checks))
    return out


def _median_max(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{max(values):.3f}] n={len(values)}"


# --- running ---------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="recovery.py --hot", description=__doc__.split("\n\n")[0])
    parser.add_argument("--incidents", type=int, default=10, help="incidents per scenario, variant and size "
                        "(default 10)")
    parser.add_argument("--loss-incidents", type=int, default=None,
                        help="node losses (each followed by a scale-up) per variant and size (default: --incidents)")
    parser.add_argument("--baseline-incidents", type=int, default=None,
                        help="worker crashes for the c10d variants (default: --incidents; each costs up to minutes)")
    parser.add_argument("--baseline-loss-incidents", type=int, default=None,
                        help="node losses for the c10d variants (default: --loss-incidents)")
    parser.add_argument("--blocks", type=int, default=2, help="turns each variant takes (default 2)")
    parser.add_argument("--sizes", default="2,4", help="agents per job, comma-separated (default 2,4)")
    parser.add_argument("--scenarios", default=",".join(DEFAULT_SCENARIOS),
                        help=f"default {','.join(DEFAULT_SCENARIOS)}; also spare_takeover")
    chosen = ",".join(name for name, v in VARIANTS.items() if v not in torchft_job.EXTRA)
    parser.add_argument("--variants", default=chosen, help=f"default {chosen} (torchft-*: with torchft installed, "
                        f"make bench-peers; also: {','.join(v.name for v in torchft_job.EXTRA)})")
    parser.add_argument("--hidden", type=int, default=3536, help="the model's width (3536: 100 MB of state)")
    parser.add_argument("--crash-min-one", action="store_true", help="worker crashes in jobs of nnodes 1:2N "
                        "(default N:2N: a crash then cannot seal a round of fewer members)")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="extra time per step (for a tiny model)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the workers train "
                        "(cuda: GPU number RANK modulo the GPUs there are; see bench/gpu_check.sh)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), help="the training group's backend (default: the "
                        "device's; NCCL needs a GPU per rank: one GPU shared by the ranks takes gloo)")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="restart modes: steps between saves")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a recovery may take (default 120)")
    parser.add_argument("--start-timeout", type=float, default=240.0, help="seconds to steady training at start")
    parser.add_argument("--out", type=Path, default=None, help="write hot_runs.csv here, row by row")
    parser.add_argument("--from-csv", type=Path, default=None, help="measure nothing: report an earlier run's "
                        "hot_runs.csv again (with the same --sizes, --scenarios, --variants)")
    parser.add_argument("--keep-logs", action="store_true", help="keep every agent log (default: failed runs only)")
    args = parser.parse_args(argv)
    args.scenarios = [s for s in SCENARIOS if s in args.scenarios.split(",")]
    args.sizes = [int(s) for s in args.sizes.split(",")]
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown or IN_PLACE.name not in args.variants.split(","):
        parser.error(f"variants: in-place and any of {', '.join(VARIANTS)}; unknown: {sorted(unknown)}")
    args.variants = [VARIANTS[n] for n in args.variants.split(",")]
    return args


def incidents(args: argparse.Namespace, variant: Variant) -> tuple[int, int]:
    """(worker crashes, node losses) for this variant, over all blocks."""
    losses = args.incidents if args.loss_incidents is None else args.loss_incidents
    if variant.backend != "c10d":
        return args.incidents, losses
    crashes = args.incidents if args.baseline_incidents is None else args.baseline_incidents
    return crashes, losses if args.baseline_loss_incidents is None else args.baseline_loss_incidents


def share(total: int, blocks: int, block: int) -> int:
    return total // blocks + (1 if block < total % blocks else 0)


def from_csv(path: Path) -> list[Incident]:
    """The rows of an earlier run's hot_runs.csv (to report it again)."""
    rows = []
    with path.open(newline="") as f:
        for raw in csv.DictReader(f):
            numeric = ("value", "replacement_in_group", "transfer_s", "transfer_bytes", "stall_s", "steps_lost")
            number = {k: float(v) if v not in ("", "None") else None for k, v in raw.items()
                      if k in numeric or k.startswith("phase_")}
            phases = {p: number[f"phase_{p}"] for p in PHASES if number.get(f"phase_{p}") is not None}
            rows.append(Incident(
                raw["scenario"], raw["variant"], int(raw["repeat"]), number["value"],
                {"True": True, "False": False}.get(raw["clean"]), raw["note"], agents=int(raw["agents"]),
                phases=phases or None, replacement_in_group=number["replacement_in_group"],
                transfer_s=number["transfer_s"],
                transfer_bytes=int(number["transfer_bytes"]) if number["transfer_bytes"] is not None else None,
                stall_s=number.get("stall_s"),
                steps_lost=int(number["steps_lost"]) if number.get("steps_lost") is not None else None,
            ))
    return rows


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    env = common.environment()
    common.print_environment(env)
    if args.from_csv:
        print("\n".join(report(args, from_csv(args.from_csv), args.variants)))
        return 0
    skip = torchft_job.missing() if any(v.backend == torchft_job.BACKEND for v in args.variants) else None
    if skip:  # ours run all the same
        print(skip)
        args.variants = [v for v in args.variants if v.backend != torchft_job.BACKEND]
    elif any(v.backend == torchft_job.BACKEND for v in args.variants):
        print(f"# torchft: {importlib.metadata.version('torchft')}")
    root = Path(tempfile.mkdtemp(prefix="elastic-bench-hot-"))
    common.exit_cleanly_on_sigterm()
    with EtcdServer() as etcd:
        bench = HotBench(args, etcd, root)
        try:
            for b in range(args.blocks):
                bench.repeat = b
                for size in args.sizes:
                    for variant in args.variants:
                        crashes, losses = incidents(args, variant)
                        bench.block(variant, size, share(crashes, args.blocks, b), share(losses, args.blocks, b))
        finally:
            if bench.current is not None:
                bench.current.stop()
            bench.store.close()
    print("\n".join(report(args, bench.rows, args.variants)))
    if bench.failed_logs:
        print(f"\n# logs of failed or unclean runs kept under {root}", file=sys.stderr)
    elif not args.keep_logs:
        shutil.rmtree(root, ignore_errors=True)
    return 0
