"""Rendezvous at scale: N simulated members, no training, each backend's handler driven directly.

N members call `next_rendezvous()` at the same instant (--nnodes=N:N, so the round seals when the N-th
member arrives and no last-call wait applies: the defaults and the equal settings coincide). Each member
is one handler with its own store connection, run as a thread; `--members-per-proc` members (default 4)
share one worker process. The worker processes are forked from a forkserver that imported torch once, so
N/4 processes fit in memory where N processes each importing torch would not; few members per process
matters because N handlers in one Python process mostly contend for its GIL (the etcd-v3 handler has a
few background threads: lease keep-alive, watch). Measured per round:

  time      from the common start to the moment the last member holds its rank (ranks 0..N-1, world N)
  requests  etcd-v3: gRPC messages etcd received (its /metrics, grpc_server_msg_received_total: every
            unary call, every lease keep-alive, every watch create);
            c10d: calls the DynamicRendezvousHandlers made on their TCPStore clients, counted by a
            wrapping Store (a TCPStore `get` is a WAIT plus a GET on the wire, so the wire carries up
            to calls + gets messages)
  bytes     etcd-v3: bytes etcd sent to clients (etcd_network_client_grpc_sent_bytes_total);
            c10d: bytes returned by get/compare_set (the pickled rendezvous state, read again and again)

c10d's store is hosted by this benchmark's process (in torchrun the first agent hosts it).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: bench/ is on sys.path, the repo root (bench, harness) is not
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.handlers import c10d_store_server, make_handler

BACKENDS = ("etcd-v3", "c10d")


def member_process(conn: Any, backend: str, endpoint: str, run_id: str, n: int, indices: list[int],
                   timeout: float) -> None:
    """One worker process: build its handlers, wait for the common start, rendezvous, report, exit hard."""
    try:
        made = [make_handler(backend, endpoint, run_id, n, n, i) for i in indices]
        conn.send(("ready", os.getpid()))
        go_at = conn.recv()
        cpu_before = _cpu_seconds()
        results: list[Any] = [None] * len(made)

        def member(k: int) -> None:
            delay = go_at - time.time()
            if delay > 0:
                time.sleep(delay)
            try:
                info = made[k][0].next_rendezvous()
                results[k] = (time.time(), info.rank, info.world_size, None)
            except Exception as err:
                results[k] = (time.time(), -1, -1, f"{type(err).__name__}: {err}")

        threads = [threading.Thread(target=member, args=(k,), daemon=True) for k in range(len(made))]
        for t in threads:
            t.start()
        deadline = go_at + timeout
        for t in threads:
            t.join(max(deadline - time.time(), 0.01))
        calls: dict[str, int] = {}
        bytes_read = 0
        for _, store in made:
            if store is not None:
                for op, count in store.calls.items():
                    calls[op] = calls.get(op, 0) + count
                bytes_read += store.bytes_read
        conn.send(("done", results, calls, bytes_read, _cpu_seconds() - cpu_before))
    except BaseException as err:
        conn.send(("error", f"{type(err).__name__}: {err}"))
    finally:
        conn.close()
        os._exit(0)  # no orderly shutdown of N handlers: the next measurement needs the CPU


@dataclass
class Measurement:
    backend: str
    n: int
    repeat: int
    seconds: float | None
    requests: float
    bytes_read: float
    detail: dict[str, float] = field(default_factory=dict)
    note: str = ""
    client_cpu: float = 0.0  # CPU seconds the member processes used from the start to the last rank
    server_cpu: float = 0.0  # CPU seconds of the store's process (etcd; the c10d store's host process)


PRELOAD = ["torch", "torch.distributed.elastic.rendezvous.dynamic_rendezvous",
           "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend", "elastic.rendezvous.handler"]


def measure(backend: str, n: int, repeat: int, per_proc: int, etcd_url: str, etcd_pid: int | None,
            timeout: float) -> Measurement:
    run_id = f"scale-{n}-{time.time_ns() % 10**12}"
    server = None
    if backend == "c10d":
        server = c10d_store_server()
        endpoint = f"127.0.0.1:{server.port}"
        server_pid = os.getpid()  # the TCPStore server runs on a thread of this process
    else:
        endpoint = etcd_url
        server_pid = etcd_pid
    metrics = common.EtcdMetrics(etcd_url)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    procs = max(1, math.ceil(n / per_proc))
    groups = [list(range(p, n, procs)) for p in range(procs)]
    pipes, workers = [], []
    for indices in groups:
        parent, child = ctx.Pipe()
        worker = ctx.Process(target=member_process, args=(child, backend, endpoint, run_id, n, indices, timeout))
        worker.start()
        child.close()
        pipes.append(parent)
        workers.append(worker)
    try:
        for conn in pipes:
            if not conn.poll(300):
                raise RuntimeError("a member process did not get ready within 300 s")
            message = conn.recv()
            if message[0] != "ready":
                raise RuntimeError(f"member process failed: {message[1]}")
        before = metrics.sample()
        go_at = time.time() + 1.0
        for conn in pipes:
            conn.send(go_at)
        results: list[Any] = []
        calls: dict[str, float] = {}
        bytes_read = 0.0
        client_cpu = 0.0
        server_before = _cpu_seconds(server_pid)
        for conn in pipes:
            if not conn.poll(timeout + 60):
                raise RuntimeError("a member process did not report")
            message = conn.recv()
            if message[0] != "done":
                raise RuntimeError(f"member process failed: {message[1]}")
            results += message[1]
            for op, count in message[2].items():
                calls[op] = calls.get(op, 0) + count
            bytes_read += message[3]
            client_cpu += message[4]
        after = metrics.sample()
        server_cpu = _cpu_seconds(server_pid) - server_before
    finally:
        for worker in workers:
            worker.join(10)
            if worker.is_alive():
                worker.kill()
                worker.join()
    done = [r for r in results if r is not None and r[3] is None]
    errors = sorted({r[3] for r in results if r is not None and r[3] is not None})
    ranks = sorted(r[1] for r in done)
    complete = len(done) == n and ranks == list(range(n)) and all(r[2] == n for r in done)
    seconds = max(r[0] for r in done) - go_at if complete else None
    note = "" if complete else f"{len(done)}/{n} members got a rank within {timeout:g} s; {'; '.join(errors)[:300]}"
    if backend == "etcd-v3":
        delta = common.EtcdMetrics.delta(before, after)
        detail = common.EtcdMetrics.by_method(delta)
        return Measurement(backend, n, repeat, seconds, common.EtcdMetrics.requests(delta),
                           delta.get("bytes_sent", 0.0), detail, note, client_cpu, server_cpu)
    del server
    return Measurement(backend, n, repeat, seconds, float(sum(calls.values())), bytes_read,
                       {k: float(v) for k, v in sorted(calls.items())}, note, client_cpu, server_cpu)


def _cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of a process (this one by default), from /proc."""
    try:
        with open(f"/proc/{pid or 'self'}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def growth_exponent(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of log(value) over log(N): ~1 is O(N), ~2 is O(N^2)."""
    pts = [(math.log(n), math.log(v)) for n, v in points if v > 0]
    if len(pts) < 2:
        return math.nan
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else math.nan


def report(args: argparse.Namespace, rows: list[Measurement], env: dict[str, str]) -> list[str]:
    out = ["\n## Rendezvous of N members (nnodes N:N), seconds until every member holds its rank"]
    table_rows, results, chart = [], [], {}
    req_points: dict[str, list[tuple[int, float]]] = {b: [] for b in BACKENDS}
    byte_points: dict[str, list[tuple[int, float]]] = {b: [] for b in BACKENDS}
    for n in args.sizes:
        s: dict[str, common.Summary] = {}
        req: dict[str, float] = {}
        byt: dict[str, float] = {}
        cpu: dict[str, str] = {}
        for backend in BACKENDS:
            mine = [m for m in rows if m.backend == backend and m.n == n]
            s[backend] = common.Summary.of([m.seconds for m in mine])
            ok = [m for m in mine if m.seconds is not None]
            req[backend] = common.Summary.of([m.requests for m in ok]).median
            byt[backend] = common.Summary.of([m.bytes_read for m in ok]).median
            cpu[backend] = (f"{common.Summary.of([m.client_cpu for m in mine]).median:.1f} / "
                            f"{common.Summary.of([m.server_cpu for m in mine]).median:.1f}") if mine else "-"
            if ok:
                req_points[backend].append((n, req[backend]))
                byte_points[backend].append((n, byt[backend]))
        r = common.ratio(s["c10d"].median, s["etcd-v3"].median)
        table_rows.append((
            n, s["etcd-v3"].text(2), s["c10d"].text(2), "-" if math.isnan(r) else f"{r:.2f}x",
            _per(req["etcd-v3"], n), _per(req["c10d"], n), _kib(byt["etcd-v3"]), _kib(byt["c10d"]),
            cpu["etcd-v3"], cpu["c10d"],
        ))
        chart[f"N={n}"] = s
        for suffix in ("defaults", "equal"):
            results.append(common.result_line(f"rdzv_{n}_members_s_{suffix}", s["etcd-v3"].median, s["c10d"].median))
        results.append(common.result_line(f"store_requests_per_round_{n}", req["etcd-v3"], req["c10d"]))
        results.append(common.result_line(f"bytes_read_per_round_{n}", byt["etcd-v3"], byt["c10d"]))
    out.append(common.table(
        ["N", "etcd-v3 s", "c10d s", "ratio c10d/etcd-v3", "etcd-v3 requests (per member)",
         "c10d store calls (per member)", "etcd-v3 bytes read", "c10d bytes read",
         "etcd-v3 CPU s members / etcd", "c10d CPU s members / store host"], table_rows))
    exps = {b: growth_exponent(req_points[b]) for b in BACKENDS}
    bexps = {b: growth_exponent(byte_points[b]) for b in BACKENDS}
    out.append(
        "\nGrowth with N (slope of log requests over log N; 1 = O(N), 2 = O(N^2)): "
        + ", ".join(f"{b} requests ~N^{exps[b]:.2f}, bytes ~N^{bexps[b]:.2f}" for b in BACKENDS)
    )
    out.append("\n## Requests per round by kind (median run)")
    kinds = []
    for n in args.sizes:
        for backend in BACKENDS:
            ok = sorted((m for m in rows if m.backend == backend and m.n == n and m.seconds is not None),
                        key=lambda m: m.requests)
            if ok:
                m = ok[len(ok) // 2]
                kinds.append((n, backend, ", ".join(f"{k} {v:.0f}" for k, v in m.detail.items())))
    out.append(common.table(["N", "backend", "requests"], kinds))
    failed = [m for m in rows if m.seconds is None]
    if failed:
        out.append("\nIncomplete runs: " + "; ".join(f"{m.backend} N={m.n} #{m.repeat + 1}: {m.note}" for m in failed))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        common.write_csv(args.out / "scale_runs.csv", [common.flattened(m, "detail") for m in rows])
        out.append("\n" + common.bar_chart(args.out / "scale.png",
                                           f"Rendezvous of N members (s), median and min-max, {env['machine']}",
                                           "seconds (log)", chart, log=True))
    out.append("")
    out += results
    out.append(f"SCALING requests_per_round etcd-v3=N^{exps['etcd-v3']:.2f} c10d=N^{exps['c10d']:.2f}")
    return out


def _per(value: float, n: int) -> str:
    return "-" if math.isnan(value) else f"{value:.0f} ({value / n:.1f})"


def _kib(value: float) -> str:
    return "-" if math.isnan(value) else f"{value / 1024:.0f} KiB"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8,32,64,96,128",
                        help="member counts N (default 8,32,64,96,128; 256 did not fit on 2 cores: bench/RESULTS.md)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per N and backend (default 3)")
    parser.add_argument("--members-per-proc", type=int, default=4,
                        help="members (threads, one handler each) per worker process (default 4)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one rendezvous may take (default 300)")
    parser.add_argument("--etcd-max-txn-ops", type=int, default=None,
                        help="start etcd with --max-txn-ops=K (etcd's default is 128; the etcd-v3 seal transaction "
                             "compares every member, so N >= 128 needs more)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated subset of etcd-v3,c10d")
    parser.add_argument("--out", type=Path, default=None, help="write a CSV file and a PNG chart here")
    args = parser.parse_args(argv)
    args.backends = [b for b in BACKENDS if b in args.backends.split(",")]
    args.sizes = [int(x) for x in args.sizes.split(",")]
    if args.repeat < 1 or min(args.sizes) < 1:
        parser.error("--repeat and every size must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common.exit_cleanly_on_sigterm()
    env = common.environment()
    common.print_environment(env)
    print(f"# nnodes N:N; {args.members_per_proc} members per worker process (threads, one handler and one store "
          "connection each)")
    rows: list[Measurement] = []
    flags = [f"--max-txn-ops={args.etcd_max_txn_ops}"] if args.etcd_max_txn_ops else []
    print(f"# etcd server flags beyond the managed defaults: {' '.join(flags) or 'none (stock etcd)'}")
    with common.etcd_server(flags) as etcd:
        for n in args.sizes:
            for r in range(args.repeat):
                for backend in args.backends:
                    m = measure(backend, n, r, args.members_per_proc, etcd.client_url, etcd.process.pid,
                                args.timeout)
                    rows.append(m)
                    took = "none" if m.seconds is None else f"{m.seconds:.2f} s"
                    common.log(f"N={n:<4} {backend:<8} #{r + 1}: {took}, {m.requests:.0f} requests, "
                               f"{m.bytes_read / 1024:.0f} KiB read, CPU members {m.client_cpu:.1f} s, "
                               f"store {m.server_cpu:.1f} s "
                               f"{m.note} "
                               + ", ".join(f"{k} {v:.0f}" for k, v in m.detail.items()))
    print("\n".join(report(args, rows, env)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
