"""Steady-state cost of the rendezvous backend: training throughput, and store requests while training.

Two stock-torchrun agents (1 gloo worker each, `examples/train_ddp.py --step-seconds 0`) train; after a
warm-up, steps/s is measured over a fixed window from the step lines' own timestamps. Variants, run
interleaved (A B C D A B C D ...):

  etcd-v3         defaults (lease_seconds=10: one keep-alive per lease every 3.3 s)
  c10d-defaults   torch defaults (keep-alive every 5 s)
  etcd-v3-equal   lease_seconds=15: keep-alives every 5 s, c10d's cadence
  c10d-equal      last_call_timeout=2 (steady state identical to c10d-defaults)

During the window, etcd's own counters (/metrics) give the etcd-v3 agents' requests per second by kind:
they should be lease keep-alives only (the watch stream stays open and costs no request). torch's c10d
store has no counters, so its steady-state traffic is measured on the side: two DynamicRendezvousHandlers
(on a counting Store) and two etcd-v3 handlers are driven like torch's agent drives them while workers run
(`num_nodes_waiting()` every monitor interval, 0.2 s), and their requests are counted over the same window.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

if not __package__:  # run as a script: bench/ is on sys.path, the repo root (bench, harness) is not
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.agentjob import BenchJob
from elastic.store.server import EtcdServer

Variant = common.Variant

MONITOR_INTERVAL = 0.2  # what torchrun_command passes to every agent


VARIANTS = [
    Variant("etcd-v3", "etcd-v3", {"max_restarts": 1000}, "defaults: lease_seconds=10 (keep-alive every 3.3 s)"),
    Variant("c10d-defaults", "c10d", {}, "torch defaults: keep-alive every 5 s"),
    Variant("etcd-v3-equal", "etcd-v3", {"max_restarts": 1000, "lease_seconds": 15},
            "lease_seconds=15: keep-alive every 5 s, like c10d"),
    Variant("c10d-equal", "c10d", {"last_call_timeout": common.EQUAL_LAST_CALL_SECONDS},
            "last_call_timeout=2, keep-alive every 5 s"),
]
PAIRS = [("defaults", "etcd-v3", "c10d-defaults"), ("equal", "etcd-v3-equal", "c10d-equal")]


@dataclass
class Run:
    variant: str
    repeat: int
    steps_per_s: float | None
    steps: int = 0
    etcd_requests_per_s: float | None = None
    by_method: dict[str, float] = field(default_factory=dict)
    note: str = ""


def training_run(variant: Variant, repeat: int, args: argparse.Namespace, etcd: EtcdServer, root: Path) -> Run:
    endpoint = etcd.client_url if variant.backend == "etcd-v3" else f"127.0.0.1:{common.free_port()}"
    directory = Path(tempfile.mkdtemp(prefix=f"overhead-{variant.name}-", dir=root))
    job = BenchJob(directory, variant.backend, endpoint, args.nnodes, variant.conf, step_seconds=0.0,
                   checkpoint_every=args.checkpoint_every, label="overhead")
    metrics = common.EtcdMetrics(etcd.client_url)
    try:
        t0 = time.time()
        for _ in range(2):
            job.add()
        first = job.wait_for(lambda: job.first_new_round_step(t0, 2, set()), args.timeout)
        if first is None:
            return Run(variant.name, repeat, None, note="no first step\n" + job.tail_text())
        w0 = first.step.time + args.warmup
        w1 = w0 + args.window
        _sleep_until(w0)
        before = metrics.sample()
        _sleep_until(w1)
        after = metrics.sample()
        job.wait_for(lambda: any(s.step.time > w1 for s in job.steps()), 10)
        window = [s for s in job.steps() if w0 <= s.step.time <= w1 and s.step.world_size == 2]
        restarts = {s.round_key for s in window}
        if len(window) < 2 or len(restarts) != 1:
            return Run(variant.name, repeat, None, note=f"{len(window)} steps, rounds {sorted(restarts)} in window")
        rate = (len(window) - 1) / (window[-1].step.time - window[0].step.time)
        run = Run(variant.name, repeat, rate, len(window))
        if variant.backend == "etcd-v3":
            delta = common.EtcdMetrics.delta(before, after)
            seconds = w1 - w0
            run.etcd_requests_per_s = common.EtcdMetrics.requests(delta) / seconds
            run.by_method = {k: v / seconds for k, v in common.EtcdMetrics.by_method(delta).items()}
        return run
    finally:
        job.stop()
        shutil.rmtree(directory, ignore_errors=True)


def _sleep_until(t: float) -> None:
    delay = t - time.time()
    if delay > 0:
        time.sleep(delay)


def agent_loop_requests(backend: str, seconds: float, etcd: EtcdServer) -> tuple[float, dict[str, float]]:
    """Requests/s of two rendezvoused handlers polled like torch's agent polls them while workers train."""
    try:
        from bench.handlers import c10d_store_server, make_handler
    except ModuleNotFoundError:
        from handlers import c10d_store_server, make_handler  # type: ignore[no-redef]

    server = c10d_store_server() if backend == "c10d" else None
    endpoint = f"127.0.0.1:{server.port}" if server else etcd.client_url
    run_id = f"overhead-loop-{time.time_ns() % 10**12}"
    made = [make_handler(backend, endpoint, run_id, 2, 2, i, {"max_restarts": 1000} if backend == "etcd-v3" else None)
            for i in range(2)]
    threads = [threading.Thread(target=h.next_rendezvous, daemon=True) for h, _ in made]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    metrics = common.EtcdMetrics(etcd.client_url)
    for _, store in made:
        if store is not None:
            store.reset()
    before = metrics.sample()
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        for handler, _ in made:
            handler.num_nodes_waiting()
        time.sleep(MONITOR_INTERVAL)
    if backend == "etcd-v3":
        delta = common.EtcdMetrics.delta(before, metrics.sample())
        by_kind = {k: v / seconds for k, v in common.EtcdMetrics.by_method(delta).items()}
    else:
        calls: dict[str, float] = {}
        for _, store in made:
            assert store is not None
            for op, count in store.calls.items():
                calls[op] = calls.get(op, 0.0) + count / seconds
        by_kind = calls
    for handler, _ in made:  # leave, so that heartbeats and keep-alives stop disturbing the next runs
        handler.shutdown()
    return sum(by_kind.values()), by_kind


def report(args: argparse.Namespace, runs: list[Run], loops: dict[str, list[tuple[float, dict[str, float]]]],
           env: dict[str, str]) -> list[str]:
    out = ["\n## Variants", common.table(["variant", "settings"], [(v.name, v.description) for v in VARIANTS])]
    s = {v.name: common.Summary.of([r.steps_per_s for r in runs if r.variant == v.name]) for v in VARIANTS}
    out.append(f"\n## Training throughput, steps/s over a {args.window:g} s window (2 agents x 1 gloo worker, "
               f"--step-seconds 0, checkpoint every {args.checkpoint_every}); ratio = etcd-v3 / c10d")
    rows, results = [], []
    for suffix, etcd_name, c10d_name in PAIRS:
        r = common.ratio(s[etcd_name].median, s[c10d_name].median)
        diff = "-" if math.isnan(r) else f"{(r - 1) * 100:+.1f} %"
        rows.append((f"steps_per_s_{suffix}", etcd_name, s[etcd_name].text(1), c10d_name, s[c10d_name].text(1),
                     "-" if math.isnan(r) else f"{r:.3f}", diff))
        results.append(common.result_line(f"steps_per_s_{suffix}", s[etcd_name].median, s[c10d_name].median,
                                          inverted=True))
    out.append(common.table(["metric", "etcd-v3 variant", "steps/s", "c10d variant", "steps/s", "ratio", "difference"],
                            rows))

    out.append("\n## etcd requests per second while training (etcd's /metrics, both agents together)")
    req_rows = []
    for name in ("etcd-v3", "etcd-v3-equal"):
        mine = [r for r in runs if r.variant == name and r.etcd_requests_per_s is not None]
        if not mine:
            continue
        total = common.Summary.of([r.etcd_requests_per_s for r in mine])
        kinds: dict[str, list[float]] = {}
        for r in mine:
            for k, v in r.by_method.items():
                kinds.setdefault(k, []).append(v)
        only_keepalives = all(set(r.by_method) <= {"LeaseKeepAlive"} for r in mine)
        req_rows.append((name, total.text(2), ", ".join(f"{k} {common.Summary.of(v).median:.2f}/s"
                                                        for k, v in sorted(kinds.items())) or "none",
                         "yes" if only_keepalives else "NO"))
    out.append(common.table(["variant", "requests/s", "by kind", "keep-alives only"], req_rows))

    out.append("\n## Store requests per second of the agent loop (2 handlers rendezvoused, num_nodes_waiting() "
               f"every {MONITOR_INTERVAL} s, counted over {args.window:g} s)")
    loop_rows = []
    loop_median: dict[str, float] = {}
    for backend, values in loops.items():
        total = common.Summary.of([v[0] for v in values])
        loop_median[backend] = total.median
        kinds = {}
        for _, by_kind in values:
            for k, v in by_kind.items():
                kinds.setdefault(k, []).append(v)
        source = "etcd /metrics" if backend == "etcd-v3" else "counting Store wrapper (store calls)"
        loop_rows.append((backend, total.text(2), ", ".join(f"{k} {common.Summary.of(v).median:.2f}/s"
                                                            for k, v in sorted(kinds.items())), source))
    out.append(common.table(["backend", "requests/s", "by kind", "counted by"], loop_rows))
    bad = [r for r in runs if r.steps_per_s is None]
    if bad:
        out.append("\nFailed runs: " + "; ".join(f"{r.variant} #{r.repeat + 1}: {r.note[:300]}" for r in bad))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        common.write_csv(args.out / "overhead_runs.csv", [common.flattened(r, "by_method") for r in runs])
        out.append("\n" + common.bar_chart(args.out / "overhead.png",
                                           f"Training throughput (steps/s), median and min-max, {env['machine']}",
                                           "steps/s", {"steps/s": s}))
    out.append("")
    out += results
    if "etcd-v3" in loop_median and "c10d" in loop_median:
        results_line = common.result_line("store_requests_per_s_steady", loop_median["etcd-v3"], loop_median["c10d"])
        out.append(results_line)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per variant (default 3)")
    parser.add_argument("--window", type=float, default=20.0, help="measured seconds of training per run (default 20)")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds after the first step before measuring")
    parser.add_argument("--nnodes", default="2:2",
                        help="torchrun --nnodes (default 2:2: the round seals at once; the steady state does not "
                             "depend on the last call)")
    parser.add_argument("--checkpoint-every", type=int, default=100, help="checkpoint every K steps (default 100)")
    parser.add_argument("--variants", default=",".join(v.name for v in VARIANTS), help="comma-separated subset")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds to wait for the first step")
    parser.add_argument("--out", type=Path, default=None, help="write a CSV file and a PNG chart here")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.window <= 0:
        parser.error("--repeat must be >= 1 and --window > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common.exit_cleanly_on_sigterm()
    chosen = [v for v in VARIANTS if v.name in args.variants.split(",")]
    env = common.environment()
    common.print_environment(env)
    root = Path(tempfile.mkdtemp(prefix="elastic-bench-overhead-"))
    runs: list[Run] = []
    loops: dict[str, list[tuple[float, dict[str, float]]]] = {"etcd-v3": [], "c10d": []}
    try:
        with EtcdServer() as etcd:
            for r in range(args.repeat):
                for variant in chosen:
                    run = training_run(variant, r, args, etcd, root)
                    runs.append(run)
                    rate = "none" if run.steps_per_s is None else f"{run.steps_per_s:.1f} steps/s ({run.steps} steps)"
                    extra = "" if run.etcd_requests_per_s is None else f", etcd {run.etcd_requests_per_s:.2f} req/s"
                    common.log(f"{variant.name:<14} #{r + 1}: {rate}{extra} {run.note[:200]}")
                for backend in loops:
                    total, kinds = agent_loop_requests(backend, args.window, etcd)
                    loops[backend].append((total, kinds))
                    common.log(f"agent loop {backend:<8} #{r + 1}: {total:.2f} requests/s {kinds}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\n".join(report(args, runs, loops, env)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
