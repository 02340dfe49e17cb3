"""Churn: capacity reclaimed and returned on a seeded schedule; how much training each variant gets done.

Why: a single incident (bench/hot.py) says how fast one recovery is; a cluster of spot or preemptible nodes
reclaims and returns capacity all the time, and what matters there is the work that survives. One job of
`examples/train_inplace.py` (gloo on CPU, 1 worker per agent) per variant block, `--agents` agents (default
4), `--nnodes 2:N`; a seeded schedule of capacity events, the same for every variant of a block:

  notice   SIGTERM to one agent process (a spot reclaim with notice: it leaves its round as a free
           Preempted departure and its workers stop; SIGKILL after `--grace` seconds if it has not exited)
  kill     SIGKILL of one agent and its workers (a node lost without notice)
  return   a fresh agent launched (capacity back)

Events come every 20-90 s, scaled down by `--duration` (so that a short run still has about 6), never
taking the job below 2 agents; reclaims alternate with and without notice (from a seeded
start). The victim is drawn by the schedule among the live agents (rank 0's agent
and the c10d store host included: a real reclaim does not choose). Variants, taking turns (`--blocks`):

  in-place-spares  elastic agent --recovery=in-place, `--rdzv-conf spares=1` and one agent more than
                   --agents: rounds seal at --agents, the extra one waits warm and is taken in when a
                   member is lost (so this variant holds one machine more: its ideal below counts it)
  in-place         the same, no spare
  restart          elastic agent: torch's agent on etcd-v3, every worker restarted from the checkpoint
  c10d             stock torchrun, c10d tuned as bench/hot.py's c10d-tuned (last call 2 s, keep-alive 1 s x 2)

Every variant checkpoints (rank 0, every `--checkpoint-every` steps): the restart modes resume from it,
and a job that is lost (every agent gone, or no step for `--stall` seconds) is relaunched from it as a new
run id, counted in "jobs lost".

Measured per block, over the window from steady training at full size to `--duration` later:

  goodput     committed work x median step time / wall time. Committed: the steps still in the job's
              history at the end (a step redone after a restart counts once; steps lost to a restart from
              before the window are subtracted); a step at world size w counts w / N, the samples it
              processed, so that goodput and the ideal are in the same unit.
  ideal       what the available agents could have done: the time integral of min(available agents, N) / N
              over the window, / wall time (N = --agents; for in-place-spares the spare is available too).
  below       seconds the job trained at a world size below min(available agents, N), or not at all.
  charges     the job's budget key in etcd (etcd-v3 variants; a Preempted departure is free).
"""

from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import itertools
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

if not __package__:  # run as a script: bench/ is on sys.path, the repo root (bench, harness) is not
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common, hot
from bench.agentjob import AgentStep
from elastic.store import JobKeys, Store
from elastic.store.server import EtcdServer

Variant = common.Variant
SPARES = Variant("in-place-spares", "etcd-v3", hot.BUDGET | {"spares": 1},
                 "elastic agent --recovery=in-place, --rdzv-conf spares=1, one agent more than --agents")
C10D = dataclasses.replace(hot.C10D_TUNED, name="c10d")
VARIANTS = {v.name: v for v in (SPARES, hot.IN_PLACE, hot.RESTART, C10D)}
LAUNCHERS = {SPARES.name: hot.LAUNCHERS[hot.IN_PLACE.name]}  # the others: bench/hot.py's, by name
MIN_AGENTS = 2
MEAN_GAP = 55.0  # seconds: the middle of 20-90
REFERENCE_EVENTS = 6  # a run shorter than this many mean gaps has its gaps scaled down to fit about 6
STEADY_STEPS = 5
POLL = 0.25  # the loop's period: the machine has two cores and the agents need them
BIN = 0.1  # seconds: the resolution of "below the allowed size"


# --- the schedule ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """One capacity change, `at` seconds into the window; `draw` in [0, 1) picks the victim."""

    at: float
    kind: str  # notice | kill | return
    draw: float


def schedule(seed: int, block: int, duration: float, agents: int) -> list[Event]:
    """The events of one block: the same for every variant (seeded by seed and block), gaps 20-90 s scaled
    by min(1, duration / (6 x 55 s)); capacity never below MIN_AGENTS, never above where it started; reclaims
    alternate with and without notice."""
    rng = random.Random(seed * 1000 + block)
    scale = min(1.0, duration / (REFERENCE_EVENTS * MEAN_GAP))
    events: list[Event] = []
    at, reclaimed, reclaims = 0.0, 0, rng.randrange(2)  # reclaims alternate notice / kill from a seeded start,
    while True:                                           # so that a short run has both kinds
        at += rng.uniform(20.0, 90.0) * scale
        if at >= duration:
            return events
        coin, draw = rng.random(), rng.random()  # always drawn: one stream, one schedule
        if reclaimed == 0:
            reclaim = True
        elif reclaimed >= agents - MIN_AGENTS:
            reclaim = False
        else:
            reclaim = coin < 0.5
        reclaimed += 1 if reclaim else -1
        if reclaim:
            reclaims += 1
        events.append(Event(at, ("notice" if reclaims % 2 else "kill") if reclaim else "return", draw))


# --- what was measured ------------------------------------------------------------------------------


@dataclass
class Block:
    """One variant's block: the measured numbers (NaN where there are none) and what happened."""

    variant: str
    block: int
    agents: int
    duration: float
    events: int = 0
    committed: float = float("nan")  # full-size steps (a step at world size w counts w / agents)
    median_step_s: float = float("nan")
    goodput: float = float("nan")
    ideal: float = float("nan")
    below_s: float = float("nan")
    charges: int | None = None
    charge_reasons: str = ""
    jobs_lost: int = 0
    load: float = float("nan")  # the machine's 1-minute load average at the block's end (it is shared)
    note: str = ""

    @property
    def efficiency(self) -> float:
        return common.ratio(self.goodput, self.ideal)


@dataclass(frozen=True)
class Line:
    """A step line of one of the block's jobs (job: its index, so that round keys of two jobs differ)."""

    job: int
    step: AgentStep

    @property
    def time(self) -> float:
        return self.step.step.time

    @property
    def number(self) -> int:
        return self.step.step.step

    @property
    def world_size(self) -> int:
        return self.step.step.world_size

    @property
    def round_key(self) -> tuple[int, int, int, int]:
        return (self.job, *self.step.round_key)


def committed_work(lines: Sequence[Line], t0: float, t1: float, size: int) -> float:
    """Full-size steps the window added to the job's history (see the module's docstring).

    The history is a stack of step lines in time order: a step line with a number no greater than the top
    (a restart resumed from a checkpoint) pops what it redoes. What remains in the window counts; what was
    popped from before the window was lost in it, and is subtracted.
    """
    stack: list[Line] = []
    lost_before = 0.0
    for line in sorted(lines, key=lambda x: x.time):
        if line.time > t1:
            break
        while stack and stack[-1].number >= line.number:
            popped = stack.pop()
            if popped.time <= t0 < line.time:
                lost_before += popped.world_size
        stack.append(line)
    kept = sum(s.world_size for s in stack if t0 < s.time <= t1)
    return (kept - lost_before) / size


def median_step_seconds(lines: Sequence[Line]) -> float:
    """Median time between consecutive steps (n, n + 1) of one round: what a step costs when nothing happens."""
    ordered = sorted(lines, key=lambda x: x.time)
    gaps = [b.time - a.time for a, b in itertools.pairwise(ordered)
            if a.round_key == b.round_key and b.number == a.number + 1]
    return statistics.median(gaps) if gaps else float("nan")


def capacity_at(timeline: Sequence[tuple[float, int]], t: float) -> int:
    value = timeline[0][1]
    for at, capacity in timeline:
        if at > t:
            break
        value = capacity
    return value


def size_timeline(lines: Sequence[Line], t0: float, t1: float, stale: float) -> list[int]:
    """World size trained at, per BIN of the window (0: no step within `stale` s on either side)."""
    bins = [0] * max(int((t1 - t0) / BIN), 1)
    ordered = sorted(lines, key=lambda x: x.time)
    for a, b in itertools.pairwise(ordered):
        if b.time - a.time > stale or b.time <= t0 or a.time >= t1:
            continue
        first, last = max(int((a.time - t0) / BIN), 0), min(int((b.time - t0) / BIN), len(bins) - 1)
        for i in range(first, last + 1):
            bins[i] = max(bins[i], b.world_size)
    return bins


def measure(row: Block, lines: Sequence[Line], t0: float, t1: float, timeline: Sequence[tuple[float, int]]) -> None:
    """Fill in goodput, ideal and time below the allowed size from the step lines and the capacity timeline."""
    size, wall = row.agents, t1 - t0
    row.median_step_s = median_step_seconds([x for x in lines if t0 - 30 < x.time <= t1])
    row.committed = committed_work(lines, t0, t1, size)
    row.goodput = row.committed * row.median_step_s / wall
    trained = size_timeline(lines, t0, t1, max(1.0, 5 * row.median_step_s))
    allowed = [min(capacity_at(timeline, t0 + (i + 0.5) * BIN), size) for i in range(len(trained))]
    row.ideal = sum(allowed) / size * BIN / wall
    row.below_s = BIN * sum(1 for got, can in zip(trained, allowed, strict=True) if got < can)


# --- running a block ----------------------------------------------------------------------------


@dataclass
class Churn:
    """The live state of one block: its jobs (one, unless one was lost), capacity, agents being reclaimed."""

    variant: Variant
    block: int
    root: Path
    capacity: int
    jobs: list[hot.HotJob] = field(default_factory=list)
    leaving: dict[int, float] = field(default_factory=dict)  # agent of the current job -> SIGKILL deadline
    timeline: list[tuple[float, int]] = field(default_factory=list)
    events: list[dict[str, object]] = field(default_factory=list)
    launched_at: float = 0.0

    @property
    def job(self) -> hot.HotJob:
        return self.jobs[-1]


class ChurnBench:
    def __init__(self, args: argparse.Namespace, etcd: EtcdServer, root: Path) -> None:
        self.args = args
        self.etcd = etcd
        self.store = Store(etcd.client_url)
        self.root = root
        self.rows: list[Block] = []
        self.event_rows: list[dict[str, object]] = []
        self.failed_logs: list[str] = []
        self.current: Churn | None = None  # stopped if the bench is interrupted

    def launch(self, churn: Churn, agents: int) -> hot.HotJob:
        """A new job (run id) of `agents` agents, resuming from the block's checkpoint directory."""
        v, args = churn.variant, self.args
        extra = 1 if v is SPARES else 0
        script_args = ["--hidden", str(args.hidden), "--step-seconds", str(args.step_seconds), "--steps",
                       "1000000", "--checkpoint-dir", str(churn.root / "checkpoints"), "--checkpoint-every",
                       str(args.checkpoint_every)]
        endpoint = self.etcd.client_url if v.backend == "etcd-v3" else f"127.0.0.1:{common.free_port()}"
        job = hot.HotJob(churn.root / f"job{len(churn.jobs)}", v, endpoint, f"{MIN_AGENTS}:{args.agents + extra}",
                         script_args, launcher=LAUNCHERS.get(v.name), label="churn")
        churn.jobs.append(job)
        churn.leaving.clear()
        churn.launched_at = time.time()
        for _ in range(agents):
            job.add()
        return job

    def block(self, variant: Variant, block: int, events: list[Event]) -> Block:
        args = self.args
        row = Block(variant.name, block, args.agents, args.duration, events=len(events))
        full = args.agents + (1 if variant is SPARES else 0)
        root = Path(tempfile.mkdtemp(prefix=f"churn-{variant.name}-{block}-", dir=self.root))
        churn = Churn(variant, block, root, full)
        self.current = churn
        try:
            job = self.launch(churn, full)
            if not job.wait_steady(args.agents, churn.launched_at, STEADY_STEPS, args.start_timeout):
                row.note = f"never trained at {args.agents} agents within {args.start_timeout:g} s"
                common.log(f"{variant.name}: {row.note}\n{job.tail_text()}")
                self.failed_logs.append(str(root))
                return row
            t0 = time.time()
            churn.timeline.append((t0, full))
            pending = list(events)
            while (now := time.time()) < t0 + args.duration:
                while pending and t0 + pending[0].at <= now:
                    self.apply(churn, pending.pop(0), t0)
                self.reap(churn)
                if (why := self.lost(churn)) is not None:
                    row.jobs_lost += 1
                    common.log(f"{variant.name}: job {churn.job.run_id} lost ({why}); relaunched with "
                               f"{churn.capacity} agents\n{churn.job.tail_text(8)}")
                    self.failed_logs.append(str(root))
                    churn.job.stop()
                    self.launch(churn, churn.capacity)
                time.sleep(POLL)
            t1 = time.time()
            row.load = os.getloadavg()[0]
            lines = [Line(j, s) for j, job in enumerate(churn.jobs) for s in job.steps()]
            measure(row, lines, t0, t1, churn.timeline)
            self.charges(row, churn)
            for e in churn.events:
                e["at"] = round(float(e["at"]) - t0, 3)  # type: ignore[arg-type]
            self.event_rows += churn.events
            if row.jobs_lost:
                row.note = f"{row.jobs_lost} job(s) lost"
            return row
        finally:
            for job in churn.jobs:
                job.stop()
            self.current = None
            if str(root) not in self.failed_logs and not args.keep_logs:
                shutil.rmtree(root, ignore_errors=True)

    def apply(self, churn: Churn, event: Event, t0: float) -> None:
        """One scheduled capacity change, now."""
        job = churn.job
        victim: int | None = None
        if event.kind == "return":
            job.add()
            victim = len(job.agents) - 1
            churn.capacity += 1
        else:
            live = [i for i in job.live() if i not in churn.leaving]
            if live:
                victim = live[int(event.draw * len(live))]
                if event.kind == "notice":
                    job.agents[victim].process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
                    churn.leaving[victim] = time.time() + self.args.grace
                else:
                    job.agents[victim].kill()
            churn.capacity -= 1  # reclaimed whether or not an agent still ran there
        now = time.time()
        churn.timeline.append((now, churn.capacity))
        churn.events.append({"variant": churn.variant.name, "block": churn.block, "at": now,
                             "scheduled": round(event.at, 3), "kind": event.kind, "agent": victim,
                             "job": len(churn.jobs) - 1, "capacity": churn.capacity})
        common.log(f"{churn.variant.name}: +{now - t0:.1f} s {event.kind} agent{victim} -> {churn.capacity} agents")

    def reap(self, churn: Churn) -> None:
        """An agent given notice that has not left within --grace is killed (as a kubelet would)."""
        for index, deadline in list(churn.leaving.items()):
            agent = churn.job.agents[index]
            if agent.returncode is not None:
                del churn.leaving[index]
            elif time.time() > deadline:
                common.log(f"{churn.variant.name}: agent{index} still running {self.args.grace:g} s after "
                           "SIGTERM: SIGKILL")
                agent.kill()
                del churn.leaving[index]

    def lost(self, churn: Churn) -> str | None:
        """Why the current job is lost (every agent gone by itself, or no step for --stall s), else None."""
        job = churn.job
        if not [i for i in job.live() if i not in churn.leaving]:
            codes = sorted({a.returncode for a in job.agents if a.returncode is not None}, key=str)
            return f"no agent left running (exit codes {codes})"
        job.poll()
        last = max([churn.launched_at] + [t.steps[-1][1].time for t in job.tails if t.steps])
        if time.time() - last > self.args.stall:
            return f"no step for {self.args.stall:g} s"
        return None

    def charges(self, row: Block, churn: Churn) -> None:
        """The charges in each etcd-v3 job's budget key (read before the agents are stopped)."""
        if churn.variant.backend != "etcd-v3":
            return
        reasons: collections.Counter[str] = collections.Counter()
        used = 0
        for job in churn.jobs:
            budget = self.store.get_json(JobKeys.parse(job.run_id).budget) or {}
            used += int(budget.get("used", 0))
            reasons.update(str(c.get("reason")) for c in budget.get("charges", []))
        row.charges = used
        row.charge_reasons = " ".join(f"{k}:{n}" for k, n in sorted(reasons.items()))

    def record(self, row: Block) -> None:
        self.rows.append(row)
        common.log(f"{row.variant} block {row.block}: goodput {common.number(row.goodput)} of ideal "
                   f"{common.number(row.ideal)}, below {common.number(row.below_s, 1)} s, charges {row.charges}, "
                   f"jobs lost {row.jobs_lost} {row.note}")
        if self.args.out:
            common.write_csv(self.args.out / "churn_runs.csv", [_flat(r) for r in self.rows])
            common.write_csv(self.args.out / "churn_events.csv", self.event_rows)


def _flat(row: Block) -> dict[str, object]:
    return dict(row.__dict__) | {"efficiency": row.efficiency}


# --- the report ---------------------------------------------------------------------------------


def report(args: argparse.Namespace, rows: list[Block], variants: list[Variant]) -> list[str]:
    out = ["\n## Variants", common.table(["variant", "settings"], [(v.name, v.description) for v in variants])]
    out.append(f"\n## Churn: {args.agents} agents (nnodes {MIN_AGENTS}:N), {args.duration:g} s per block; "
               "median [min-max] over blocks")
    table_rows = []
    for v in variants:
        mine = [r for r in rows if r.variant == v.name]
        if not mine:
            continue
        charges = [r.charges for r in mine if r.charges is not None]
        reasons = collections.Counter[str]()
        for r in mine:
            reasons.update({k: int(n) for k, n in (p.split(":") for p in r.charge_reasons.split())})
        table_rows.append([
            v.name,
            common.Summary.of(r.goodput for r in mine).text(3),
            common.Summary.of(r.ideal for r in mine).text(3),
            common.Summary.of(r.efficiency for r in mine).text(2),
            common.Summary.of(r.below_s for r in mine).text(1),
            (f"{sum(charges)} ({', '.join(f'{k} {n}' for k, n in sorted(reasons.items())) or 'none'})"
             if charges else "n/a (c10d)" if v.backend == "c10d" else "—"),
            str(sum(r.jobs_lost for r in mine)),
            common.Summary.of(r.committed for r in mine).text(0),
            common.Summary.of(r.median_step_s for r in mine).text(3),
            str(sum(r.events for r in mine)),
            common.Summary.of(r.load for r in mine if r.load == r.load).text(1),  # (NaN: an older CSV)
        ])
    out.append(common.table(["variant", "goodput", "ideal", "goodput / ideal", "below allowed size, s",
                             "charges", "jobs lost", "committed (full-size steps)", "step, s", "events", "load at end"],
                            table_rows))
    notes = [f"{r.variant} block {r.block}: {r.note}" for r in rows if r.note]
    if notes:
        out.append("\n" + "\n".join(notes))
    medians = {v: common.Summary.of(r.goodput for r in rows if r.variant == v).median for v in VARIANTS}
    efficiency = {v: common.Summary.of(r.efficiency for r in rows if r.variant == v).median for v in VARIANTS}
    out.append("\n(ratio_vs_c10d: in-place-spares / c10d)\n")
    for metric, values in (("churn_goodput", medians), ("churn_efficiency", efficiency)):
        out.append(f"RESULT {metric} " + " ".join(f"{k.replace('-', '_')}={common.number(x)}"
                                                  for k, x in values.items())
                   + f" ratio_vs_c10d={common.number(common.ratio(values[SPARES.name], values[C10D.name]), 2)}")
    return out


def from_csv(path: Path) -> list[Block]:
    """The rows of an earlier run's churn_runs.csv (to report it again, or join split runs)."""
    rows = []
    fields = {f.name: f.type for f in dataclasses.fields(Block)}
    with path.open(newline="") as f:
        for raw in csv.DictReader(f):
            row = Block(raw["variant"], int(raw["block"]), int(raw["agents"]), float(raw["duration"]))
            for name in fields:
                if name in ("variant", "block", "agents", "duration") or name not in raw:
                    continue
                value = raw[name]
                if name in ("events", "jobs_lost"):
                    setattr(row, name, int(value))
                elif name == "charges":
                    row.charges = int(value) if value not in ("", "None") else None
                elif name in ("charge_reasons", "note"):
                    setattr(row, name, value)
                else:
                    setattr(row, name, float(value) if value not in ("", "None") else float("nan"))
            rows.append(row)
    return rows


# --- running ---------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="churn.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of churn per block (default 600)")
    parser.add_argument("--seed", type=int, default=1, help="the schedule's seed (default 1)")
    parser.add_argument("--agents", type=int, default=4, help="the job's size N, 3 or more (default 4; "
                        "in-place-spares runs N + 1)")
    parser.add_argument("--blocks", type=int, default=1, help="turns each variant takes (default 1)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"default {','.join(VARIANTS)}")
    parser.add_argument("--hidden", type=int, default=512, help="the model's width (default 512: 1 MB)")
    parser.add_argument("--step-seconds", type=float, default=0.1, help="extra time per step (default 0.1)")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps between rank 0's saves")
    parser.add_argument("--grace", type=float, default=10.0, help="seconds from SIGTERM to SIGKILL (default 10)")
    parser.add_argument("--stall", type=float, default=45.0, help="a job with no step for this long is lost "
                        "and relaunched (default 45)")
    parser.add_argument("--start-timeout", type=float, default=180.0, help="seconds to steady training at start")
    parser.add_argument("--out", type=Path, default=None, help="write churn_runs.csv and churn_events.csv here")
    parser.add_argument("--from-csv", type=Path, default=None, help="measure nothing: report an earlier "
                        "run's churn_runs.csv again (with the same --agents, --duration, --variants)")
    parser.add_argument("--keep-logs", action="store_true", help="keep every agent log (default: failed runs only)")
    args = parser.parse_args(argv)
    if args.agents < MIN_AGENTS + 1:
        parser.error(f"--agents: at least {MIN_AGENTS + 1} (the job never goes below {MIN_AGENTS})")
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        parser.error(f"variants: any of {', '.join(VARIANTS)}; unknown: {sorted(unknown)}")
    args.variants = [VARIANTS[n] for n in args.variants.split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    env = common.environment()
    common.print_environment(env)
    if args.from_csv:
        print("\n".join(report(args, from_csv(args.from_csv), args.variants)))
        return 0
    root = Path(tempfile.mkdtemp(prefix="elastic-bench-churn-"))
    common.exit_cleanly_on_sigterm()
    with EtcdServer() as etcd:
        bench = ChurnBench(args, etcd, root)
        try:
            for b in range(args.blocks):
                events = schedule(args.seed, b, args.duration, args.agents)
                common.log(f"block {b}: {len(events)} events: "
                           + ", ".join(f"{e.kind}@{e.at:.0f}s" for e in events))
                for variant in args.variants:
                    bench.record(bench.block(variant, b, events))
        finally:
            if bench.current is not None:
                for job in bench.current.jobs:
                    job.stop()
            bench.store.close()
    print("\n".join(report(args, bench.rows, args.variants)))
    if bench.failed_logs:
        print(f"\n# logs of blocks with a lost job or a failed start kept under {root}", file=sys.stderr)
    elif not args.keep_logs:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
