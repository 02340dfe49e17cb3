"""How fast a job trains again after a failure: etcd-v3 beside torch's own c10d backend, side by side.

Real stock-torchrun agents (separate processes, `examples/train_ddp.py`, gloo on CPU, 1 worker per agent)
per backend and scenario:

  cold_start       launch 2 agents (--nnodes=1:4) -> first training step of the job (all ranks step together)
  cold_start_4     the same with 4 agents (--nnodes=1:8, so that no backend seals at max nodes)
  node_loss        SIGKILL one whole agent with its worker -> first step of the survivor's new round.
                   c10d: the agent that does NOT host the store (killing the host ends the job, see host_loss);
                   etcd-v3: the agent that is not rank 0 (no agent hosts anything)
  worker_crash     SIGKILL one worker, agents live -> first step of the new round at world size 2; every
                   incident also checked for a clean recovery (no failure of a worker started after the fault)
  scale_up         launch a third agent -> first step at world size 3 (measured from that agent's launch)
  host_loss        (once per variant) SIGKILL the c10d store host / etcd-v3's rank-0 agent: recovered or dead
  floor            a bare worker restart: `torchrun --standalone` (no peers, no last call), 1 and 2 workers:
                   launch -> first step, and SIGKILL a worker -> first step of the restarted worker(s)

Variants: `etcd-v3` (its defaults, which are also the equal settings: last call 2 s; after a failure its
next round waits only for the members heard from during the incident, not the last call), `c10d-defaults`
(last call 30 s, keep-alive 5 s x 3), `c10d-equal` (last_call_timeout=2, torch's keep-alive defaults) and,
for node_loss only, `c10d-aggressive` (last_call_timeout=2, keep_alive_interval=1, keep_alive_max_attempt=2).
Every variant runs with the same `--monitor-interval=0.2`. c10d runs at its real defaults: the worker
TCPStore is shared across restarts (pytorch#135712), which is what the clean-recovery count shows.

`--hot`: hot recovery instead, `elastic agent --recovery=in-place` beside restart mode and c10d (bench/hot.py;
`--hot --help` lists its options).

Each scenario runs `--repeat` times with the variants interleaved (A B C A B C ...); the report gives the
median and min-max, a table, optional CSV/PNG (`--out DIR`) and one RESULT line per metric.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

if not __package__:  # run as a script: bench/ is on sys.path, the repo root (bench, harness) is not
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common, hot
from bench.agentjob import BenchJob, standalone_command
from elastic.store.server import EtcdServer

Variant = common.Variant
Measurement = common.Measurement

STEP_SECONDS = 0.05
CHECKPOINT_EVERY = 5


ETCD_V3 = Variant(
    "etcd-v3", "etcd-v3", {"max_restarts": 1000},
    "defaults = equal settings: lease_seconds=10, last_call_seconds=2 (skipped after a failure once the members "
    "heard from are back), settle_seconds=1 (only the job budget is raised, max_restarts=1000, so that the bench "
    "never spends it)",
)
C10D_DEFAULTS = Variant("c10d-defaults", "c10d", {}, "torch defaults: last_call_timeout=30, keep-alive 5 s x 3")
C10D_EQUAL = Variant("c10d-equal", "c10d", {"last_call_timeout": common.EQUAL_LAST_CALL_SECONDS},
                     "last_call_timeout=2 (= etcd-v3's last call), keep-alive at torch defaults 5 s x 3")
C10D_AGGRESSIVE = Variant(
    "c10d-aggressive", "c10d",
    {"last_call_timeout": common.EQUAL_LAST_CALL_SECONDS, "keep_alive_interval": 1, "keep_alive_max_attempt": 2},
    "last_call_timeout=2, keep_alive_interval=1, keep_alive_max_attempt=2 (c10d tuned for fast node-loss detection)",
)
ETCD_V2_DEFAULTS = Variant("etcd-v2-defaults", "etcd-v2", {}, "torch's etcd-v2 backend at its defaults")
ETCD_V2_EQUAL = Variant("etcd-v2-equal", "etcd-v2", {"last_call_timeout": common.EQUAL_LAST_CALL_SECONDS},
                        "torch's etcd-v2 backend, last_call_timeout=2")
ALL_VARIANTS = [ETCD_V3, C10D_DEFAULTS, C10D_EQUAL, C10D_AGGRESSIVE, ETCD_V2_DEFAULTS, ETCD_V2_EQUAL]
BY_NAME = {v.name: v for v in ALL_VARIANTS}

SCENARIOS = ["floor", "cold_start", "cold_start_4", "node_loss", "worker_crash", "scale_up", "host_loss"]
# metric name, scenario, which floor it is compared with
METRICS = [
    ("cold_start_s", "cold_start", "cold_2w"),
    ("cold_start_4_agents_s", "cold_start_4", "cold_4w"),
    ("node_loss_recovery_s", "node_loss", "restart_1w"),
    ("worker_crash_recovery_s", "worker_crash", "restart_2w"),
    ("scale_up_s", "scale_up", "cold_1w"),
]
COMPARISONS = [("defaults", "c10d-defaults"), ("equal", "c10d-equal"), ("aggressive", "c10d-aggressive")]
FLOOR_VARIANTS = {"cold_1w": "launch -> first step, 1 worker", "restart_1w": "worker SIGKILL -> first step, 1 worker",
                  "cold_2w": "launch -> first step, 2 workers", "restart_2w": "worker SIGKILL -> first step, 2 workers",
                  "cold_4w": "launch -> first step, 4 workers"}


class Bench:
    def __init__(self, args: argparse.Namespace, etcd: EtcdServer, root: Path) -> None:
        self.args = args
        self.etcd = etcd
        self.root = root
        self.rows: list[Measurement] = []
        self.live: list[BenchJob] = []
        self.failed_logs: list[str] = []

    # --- jobs ---

    def job(self, variant: Variant, nnodes: str, label: str) -> BenchJob:
        if variant.backend == "etcd-v3":
            endpoint = self.etcd.client_url
        elif variant.backend == "etcd-v2":  # pragma: no cover - only with python-etcd
            endpoint = f"127.0.0.1:{self.v2.client_port}"
        else:
            endpoint = f"127.0.0.1:{common.free_port()}"  # a fresh store (and port) per c10d job
        directory = Path(tempfile.mkdtemp(prefix=f"{label}-{variant.name}-", dir=self.root))
        job = BenchJob(directory, variant.backend, endpoint, nnodes, variant.conf, STEP_SECONDS, CHECKPOINT_EVERY,
                       label=label)
        self.live.append(job)
        return job

    def done(self, job: BenchJob, ok: bool) -> None:
        job.stop()
        if job in self.live:
            self.live.remove(job)
        if not ok:
            self.failed_logs.append(str(job.root))
        elif not self.args.keep_logs:
            shutil.rmtree(job.root, ignore_errors=True)

    def record(self, m: Measurement) -> None:
        self.rows.append(m)
        value = "none" if m.value is None else f"{m.value:.2f} s"
        clean = "" if m.clean is None else (" clean" if m.clean else " NOT CLEAN")
        common.log(f"{m.scenario:<13} {m.variant:<16} #{m.repeat + 1}: {value}{clean} {m.note}")
        if self.args.out:  # as we go: a run that is cut short keeps what it measured (see --from-csv)
            common.write_csv(self.args.out / "recovery_runs.csv", [r.__dict__ for r in self.rows])

    # --- scenarios ---

    def cold_start(self, variant: Variant, repeat: int, agents: int, nnodes: str, scenario: str) -> None:
        job = self.job(variant, nnodes, scenario)
        t0 = time.time()
        for _ in range(agents):
            job.add()
        first = job.wait_for(lambda: job.first_new_round_step(t0, agents, set()), self.args.start_timeout)
        value = first.step.time - t0 if first else None
        self.record(Measurement(scenario, variant.name, repeat, value, note="" if first else "no first step"))
        self.done(job, first is not None)

    def started(self, variant: Variant, agents: int = 2, nnodes: str = "1:4", label: str = "job") -> BenchJob | None:
        """A job of `agents` agents, training steadily at full size; None (logged) if it never got there."""
        job = self.job(variant, nnodes, label)
        t0 = time.time()
        for _ in range(agents):
            job.add()
        if job.wait_steady(agents, t0, 10, self.args.start_timeout):
            return job
        common.log(f"{label} {variant.name}: the job never trained at size {agents}\n{job.tail_text()}")
        self.done(job, False)
        return None

    def node_loss(self, variant: Variant, repeat: int) -> None:
        job = self.started(variant, label="node_loss")
        if job is None:
            self.record(Measurement("node_loss", variant.name, repeat, None, note="no start"))
            return
        if variant.backend == "c10d":
            host = job.store_host()
            victim = 1 - host if host is not None else 1
            note = f"killed agent{victim} (store host: agent{host})"
        else:
            rank0 = job.rank0_agent()
            victim = 1 - rank0 if rank0 is not None else 1
            note = f"killed agent{victim} (rank 0: agent{rank0})"
        survivor = 1 - victim
        known = job.round_keys()
        t = time.time()
        job.agents[victim].kill()
        got = job.wait_for(lambda: job.first_new_round_step(t, 1, known, {survivor}), self.args.timeout)
        value = got.step.time - t if got else None
        if got is None:
            note += f"; survivor exit code {job.agents[survivor].returncode}"
        self.record(Measurement("node_loss", variant.name, repeat, value, note=note))
        self.done(job, got is not None)

    def worker_crash(self, variant: Variant, repeat: int, incidents: int) -> None:
        job = self.started(variant, label="worker_crash")
        for i in range(incidents):
            if job is None:
                self.record(Measurement("worker_crash", variant.name, repeat, None, clean=False, note="no start"))
                job = self.started(variant, label="worker_crash")
                continue
            known = job.round_keys()
            before = job.worker_pids()
            logged = set(job.failures())
            victim = i % 2
            t = time.time()
            try:
                job.agents[victim].kill_worker()
            except RuntimeError as err:  # the agent is between rounds: should not happen once steady
                self.record(Measurement("worker_crash", variant.name, repeat, None, clean=False, note=str(err)))
                continue
            got = job.wait_for(lambda j=job, t=t, known=known: j.first_new_round_step(t, 2, known), self.args.timeout)
            if got is None:
                self.record(Measurement("worker_crash", variant.name, repeat, None, clean=False,
                                        note=f"incident {i + 1}: no recovery within {self.args.timeout:g} s"))
                common.log(job.tail_text())
                self.done(job, False)
                job = self.started(variant, label="worker_crash")
                continue
            # Clean: training runs on in that round, and no worker started after the fault has failed.
            steady = job.wait_steady(2, got.step.time, 10, 60)
            later = job.first_new_round_step(got.step.time, 2, known | {got.round_key})
            spurious = [f for f in job.failures() if f not in logged and f.pid not in before]
            clean = steady and later is None and not spurious
            note = f"incident {i + 1}: killed agent{victim}'s worker"
            if spurious:
                note += f"; {len(spurious)} failure(s) of workers started after the fault " + ", ".join(
                    f"exit {f.exit_code}" for f in spurious)
            if later is not None:
                note += "; restarted again before training steadily"
            self.record(Measurement("worker_crash", variant.name, repeat, got.step.time - t, clean=clean, note=note))
            if not clean:
                self.failed_logs.append(str(job.root))
        if job is not None:
            self.done(job, True)

    def scale_up(self, variant: Variant, repeat: int) -> None:
        job = self.started(variant, label="scale_up")
        if job is None:
            self.record(Measurement("scale_up", variant.name, repeat, None, note="no start"))
            return
        known = job.round_keys()
        t = time.time()
        job.add()
        got = job.wait_for(lambda: job.first_new_round_step(t, 3, known), self.args.timeout)
        self.record(Measurement("scale_up", variant.name, repeat, got.step.time - t if got else None))
        self.done(job, got is not None)

    def host_loss(self, variant: Variant, repeat: int) -> None:
        job = self.started(variant, label="host_loss")
        if job is None:
            self.record(Measurement("host_loss", variant.name, repeat, None, note="no start"))
            return
        if variant.backend == "c10d":
            victim = job.store_host()
            what = "store host"
        else:
            victim = job.rank0_agent()
            what = "rank-0 agent"
        if victim is None:
            self.record(Measurement("host_loss", variant.name, repeat, None, note=f"could not find the {what}"))
            self.done(job, False)
            return
        survivor = 1 - victim
        known = job.round_keys()
        t = time.time()
        job.agents[victim].kill()

        def outcome() -> tuple[str, float] | None:
            got = job.first_new_round_step(t, 1, known, {survivor})
            if got is not None:
                return ("recovered", got.step.time - t)
            if job.agents[survivor].returncode is not None:
                return (f"job died (survivor exit code {job.agents[survivor].returncode})", time.time() - t)
            return None

        result = job.wait_for(outcome, self.args.timeout)
        if result is None:
            self.record(Measurement("host_loss", variant.name, repeat, None, note=f"killed the {what}: hung"))
        else:
            state, seconds = result
            self.record(Measurement("host_loss", variant.name, repeat, seconds if state == "recovered" else None,
                                    note=f"killed the {what}: {state} after {seconds:.1f} s"))
        self.done(job, True)

    def floor(self, repeat: int) -> None:
        """A bare worker restart: torchrun --standalone, 1 and 2 (and 4) workers, no peers, no last call."""
        sizes = (1, 2, 4) if "cold_start_4" in self.args.scenarios else (1, 2)
        for nproc in sizes:
            directory = Path(tempfile.mkdtemp(prefix=f"floor-{nproc}w-", dir=self.root))
            job = BenchJob(directory, "standalone", "", "1:1", None, STEP_SECONDS, CHECKPOINT_EVERY,
                           env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}, label="floor")
            self.live.append(job)
            t0 = time.time()
            job.add(standalone_command(nproc, job.script_args))
            first = job.wait_for(lambda j=job, t0=t0, n=nproc: j.first_new_round_step(t0, n, set()),
                                 self.args.start_timeout)
            self.record(Measurement("floor", f"cold_{nproc}w", repeat, first.step.time - t0 if first else None))
            ok = first is not None
            if ok and nproc < 4 and job.wait_steady(nproc, first.step.time, 10, 60):
                known = job.round_keys()
                t = time.time()
                pids = job.agents[0].worker_pids()
                if pids:
                    os.kill(pids[-1], signal.SIGKILL)
                    got = job.wait_for(lambda j=job, t=t, k=known, n=nproc: j.first_new_round_step(t, n, k),
                                       self.args.timeout)
                    ok = got is not None
                    self.record(Measurement("floor", f"restart_{nproc}w", repeat,
                                            got.step.time - t if got else None))
            self.done(job, ok)

    def stop_all(self) -> None:
        for job in list(self.live):
            job.stop()


def variants_for(scenario: str, chosen: list[Variant]) -> list[Variant]:
    if scenario == "node_loss":
        return chosen
    return [v for v in chosen if v is not C10D_AGGRESSIVE]


def crashes_per_repeat(total: int, repeat: int) -> list[int]:
    return [total // repeat + (1 if r < total % repeat else 0) for r in range(repeat)]


def run(args: argparse.Namespace, bench: Bench, variants: list[Variant]) -> None:
    crashes = crashes_per_repeat(args.crashes, args.repeat)
    for scenario in args.scenarios:
        repeats = 1 if scenario == "host_loss" else args.repeat
        for r in range(repeats):
            if scenario == "floor":
                bench.floor(r)
                continue
            for variant in variants_for(scenario, variants):
                actions: dict[str, Callable[[], None]] = {
                    "cold_start": lambda v=variant, r=r: bench.cold_start(v, r, 2, "1:4", "cold_start"),
                    "cold_start_4": lambda v=variant, r=r: bench.cold_start(v, r, 4, "1:8", "cold_start_4"),
                    "node_loss": lambda v=variant, r=r: bench.node_loss(v, r),
                    "worker_crash": lambda v=variant, r=r: bench.worker_crash(v, r, crashes[r]),
                    "scale_up": lambda v=variant, r=r: bench.scale_up(v, r),
                    "host_loss": lambda v=variant, r=r: bench.host_loss(v, r),
                }
                actions[scenario]()


# --- the report ---------------------------------------------------------------------------------


def summaries(rows: list[Measurement]) -> dict[tuple[str, str], common.Summary]:
    keys = sorted({(m.scenario, m.variant) for m in rows})
    return {k: common.Summary.of([m.value for m in rows if (m.scenario, m.variant) == k]) for k in keys}


def report(args: argparse.Namespace, rows: list[Measurement], variants: list[Variant], env: dict[str, str],
           notes: list[str], rtt: float) -> list[str]:
    summ = summaries(rows)
    out: list[str] = []
    out.append("\n## Variants")
    out.append(common.table(["variant", "settings"], [(v.name, v.description) for v in variants]))
    for note in notes:
        out.append(f"\n{note}")

    floors = {name: summ.get(("floor", name)) for name in FLOOR_VARIANTS}
    if any(s and s.values for s in floors.values()):
        out.append("\n## Floor: a bare worker restart (torchrun --standalone, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)")
        out.append(common.table(
            ["floor", "what", "seconds, median [min-max]"],
            [(name, what, floors[name].text(2)) for name, what in FLOOR_VARIANTS.items() if floors[name]],
        ))
        out.append(f"one etcd round trip (median of 30 reads): {rtt * 1000:.2f} ms")

    out.append("\n## Time to train again, seconds: median [min-max] n (etcd-v3 vs c10d; ratio = c10d / etcd-v3)")
    header = ["metric", "vs", "etcd-v3", "c10d", "ratio", "floor", "etcd-v3 above floor", "c10d above floor"]
    table_rows = []
    results: list[str] = []
    chart: dict[str, dict[str, common.Summary]] = {}
    for metric, scenario, floor_name in METRICS:
        etcd = summ.get((scenario, ETCD_V3.name))
        if etcd is None:
            continue
        chart[metric] = {v.name: s for (sc, v_name), s in summ.items() if sc == scenario
                         for v in variants if v.name == v_name}
        floor = floors.get(floor_name)
        floor_median = floor.median if floor and floor.values else math.nan
        for suffix, c10d_name in COMPARISONS:
            c10d = summ.get((scenario, c10d_name))
            if c10d is None:
                continue
            r = common.ratio(c10d.median, etcd.median)
            table_rows.append((
                f"{metric}_{suffix}", c10d_name, etcd.text(), c10d.text(),
                "—" if math.isnan(r) else f"{r:.2f}x",
                "—" if math.isnan(floor_median) else f"{floor_median:.1f}",
                _above(etcd.median, floor_median), _above(c10d.median, floor_median),
            ))
            results.append(common.result_line(f"{metric}_{suffix}", etcd.median, c10d.median))
    out.append(common.table(header, table_rows))

    crash_rows = [m for m in rows if m.scenario == "worker_crash"]
    if crash_rows:
        out.append("\n## Worker crash: clean recoveries (training resumed, no worker of the new round failed)")
        counts = []
        for v in variants_for("worker_crash", variants):
            mine = [m for m in crash_rows if m.variant == v.name]
            if mine:
                clean = sum(1 for m in mine if m.clean)
                counts.append((v.name, f"{clean}/{len(mine)}",
                               "; ".join(sorted({m.note.split(': ', 1)[-1] for m in mine if not m.clean})) or "—"))
        out.append(common.table(["variant", "clean", "what went wrong"], counts))
        for v_name, count, _ in counts:
            out.append(f"CLEAN worker_crash {v_name}={count}")

    host_rows = [m for m in rows if m.scenario == "host_loss"]
    if host_rows:
        out.append("\n## Killing the agent that c10d depends on (its store host) / etcd-v3's rank-0 agent")
        out.append(common.table(["variant", "outcome"], [(m.variant, m.note) for m in host_rows]))

    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        common.write_csv(args.out / "recovery_runs.csv", [m.__dict__ for m in rows])
        common.write_csv(args.out / "recovery_summary.csv", [
            {"scenario": sc, "variant": v, "median_s": s.median, "min_s": s.min, "max_s": s.max, "n": s.n,
             "failed": s.failed} for (sc, v), s in summ.items()
        ])
        out.append("\n" + common.bar_chart(args.out / "recovery.png",
                                           f"Time to train again (s), median and min-max, {env['machine']}",
                                           "seconds", chart))
    out.append("")
    out += results
    return out


def report_from_csv(args: argparse.Namespace, variants: list[Variant], env: dict[str, str], notes: list[str]) -> int:
    rows: list[Measurement] = []
    for path in args.from_csv:
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                rows.append(Measurement(
                    row["scenario"], row["variant"], int(row["repeat"]),
                    float(row["value"]) if row["value"] not in ("", "None") else None,
                    {"True": True, "False": False}.get(row["clean"]), row["note"],
                ))
    print(f"# rows from: {', '.join(str(p) for p in args.from_csv)}")
    rtt = float(args.rtt_ms) / 1000 if args.rtt_ms else math.nan
    print("\n".join(report(args, rows, variants, env, notes, rtt)))
    return 0


def _above(value: float, floor: float) -> str:
    if math.isnan(value) or math.isnan(floor):
        return "—"
    return f"+{value - floor:.1f}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per scenario and variant (default 3)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma-separated, in this order (default all): {','.join(SCENARIOS)}")
    parser.add_argument("--variants", default="etcd-v3,c10d-defaults,c10d-equal,c10d-aggressive",
                        help="comma-separated (default etcd-v3,c10d-defaults,c10d-equal,c10d-aggressive; "
                             "etcd-v2-defaults,etcd-v2-equal where python-etcd exists)")
    parser.add_argument("--crashes", type=int, default=10,
                        help="worker-crash incidents per variant, spread over the repeats (default 10)")
    parser.add_argument("--timeout", type=float, default=150.0,
                        help="seconds a recovery may take before it counts as failed (default 150)")
    parser.add_argument("--start-timeout", type=float, default=300.0,
                        help="seconds a job may take from launch to steady training (default 300)")
    parser.add_argument("--out", type=Path, default=None, help="write CSV files and a PNG chart here")
    parser.add_argument("--keep-logs", action="store_true", help="keep every agent log (default: failed runs only)")
    parser.add_argument("--from-csv", type=Path, nargs="+", default=None, metavar="CSV",
                        help="measure nothing: report the rows of earlier runs' recovery_runs.csv files together "
                             "(to join the parts of a run that was split or cut short)")
    parser.add_argument("--rtt-ms", default=None, help="with --from-csv: the etcd round trip to print, in ms")
    parser.add_argument("--hot", action="store_true", help="measure hot recovery instead (bench/hot.py: in-place "
                        "beside restart mode and c10d; `--hot --help` for its options)")
    args = parser.parse_args(argv)
    args.scenarios = [s for s in SCENARIOS if s in args.scenarios.split(",")]
    unknown = set(args.variants.split(",")) - set(BY_NAME)
    if unknown:
        parser.error(f"unknown variant(s) {sorted(unknown)}; known: {', '.join(BY_NAME)}")
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--hot" in argv:
        return hot.main([a for a in argv if a != "--hot"])
    args = parse_args(argv)
    notes = []
    variants = [BY_NAME[n] for n in args.variants.split(",")]
    if ETCD_V3 not in variants:
        variants.insert(0, ETCD_V3)
    v2_skip = common.etcd_v2_skip_reason()
    if v2_skip:
        notes.append(v2_skip)
        print(v2_skip)
        variants = [v for v in variants if v.backend != "etcd-v2"]
    env = common.environment()
    common.print_environment(env)
    if args.from_csv:
        return report_from_csv(args, variants, env, notes)
    root = Path(tempfile.mkdtemp(prefix="elastic-bench-recovery-"))
    common.exit_cleanly_on_sigterm()
    with EtcdServer() as etcd:
        bench = Bench(args, etcd, root)
        if any(v.backend == "etcd-v2" for v in variants):  # pragma: no cover - only with python-etcd
            bench.v2 = common.etcd_v2_server().start()
        rtt = common.etcd_round_trip_seconds(etcd.client_url)
        try:
            run(args, bench, variants)
        finally:
            bench.stop_all()
            if getattr(bench, "v2", None) is not None:  # pragma: no cover
                bench.v2.remove()
    lines = report(args, bench.rows, variants, env, notes, rtt)
    print("\n".join(lines))
    if bench.failed_logs:
        print(f"\n# logs of failed or unclean runs kept under {root}", file=sys.stderr)
    elif not args.keep_logs:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"\n# logs under {root}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
