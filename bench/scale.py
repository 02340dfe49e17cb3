"""Rendezvous at scale: N simulated members, no training, each backend's handler driven directly.

N members call `next_rendezvous()` at the same instant (--nnodes=N-1:N, so the round seals when the N-th
member arrives and no last-call wait applies: the defaults and the equal settings coincide; N - 1 members
may go on after a loss). Each member is one handler with its own lease, its own watches and the protocol's
real decisions, as a thread; many members share one worker process (`--members-per-proc`, default N / 16)
and, for etcd-v3, its one etcd connection (`--own-connections`: one each), so that 1,024 members fit on this
machine and what is measured is etcd and the protocol, not 1,024 Python interpreters: etcd still keeps every
member's watchers and leases and sends each its own events and answers, on one watch stream and one
keep-alive stream per process (elastic.store.watch, elastic.store.keepalive). The worker processes are
forked from a forkserver that imported torch once. Then (etcd-v3) the member at rank N / 2 dies: its
keep-alives stop, nothing is revoked; the others sleep on their handler's change signal, ask
`num_nodes_waiting()` when woken, as the in-place agent does, and rendezvous again once it turns positive
(with `--lose sealer`, the member that seals the rounds dies: the others see its key go, elect
another, which ends the round on the loss). Measured per round:

  time      from the common start to the moment the last member holds its rank (ranks 0..N-1, world N)
  requests  etcd-v3: gRPC messages etcd received (its /metrics, grpc_server_msg_received_total: every
            unary call, every lease keep-alive, every watch create);
            c10d: calls the DynamicRendezvousHandlers made on their TCPStore clients, counted by a
            wrapping Store (a TCPStore `get` is a WAIT plus a GET on the wire, so the wire carries up
            to calls + gets messages)
  bytes     etcd-v3: bytes etcd sent to clients (etcd_network_client_grpc_sent_bytes_total);
            c10d: bytes returned by get/compare_set (the pickled rendezvous state, read again and again)
  events    etcd-v3: watch events etcd delivered (etcd_debugging_mvcc_events_total)
  loss      etcd-v3: from the member's death to the last survivor ranked in a round of N - 1 (the lease
            must lapse first: `--lease-seconds`), with the same counters for that round

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
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: bench/ is on sys.path, the repo root (bench, harness) is not
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.handlers import c10d_store_server, make_handler
from elastic.spec import defaults

BACKENDS = ("etcd-v3", "c10d")
PROCESSES = 16  # member processes at most, by default: each holds torch (shared by fork) and its threads
MONITOR_SECONDS = 1.0  # the longest a simulated agent sleeps between two looks at num_nodes_waiting()


def member_process(conn: Any, backend: str, endpoint: str, run_id: str, n: int, indices: list[int],
                   timeout: float, conf: dict[str, Any]) -> None:
    """One worker process: build its handlers, wait for the common start, rendezvous, report; then, told so,
    lose one member and re-rendezvous the others (etcd-v3); exit hard."""
    try:
        shared = None
        if backend == "etcd-v3" and conf.get("share_channel"):
            from elastic.store import Store

            shared = Store(endpoint, retry_seconds=15)
        options = {k: v for k, v in conf.items() if k != "share_channel"}
        made = [make_handler(backend, endpoint, run_id, max(n - 1, 1), n, i,
                             options if backend == "etcd-v3" else None, shared)
                for i in indices]  # fmt: skip
        for handler, _ in made:
            _time_joins(handler)
        conn.send(("ready", os.getpid()))
        go_at = conn.recv()
        cpu_before = _cpu_seconds()
        results = _in_threads(len(made), lambda k: _rendezvous(made[k][0], go_at), go_at + timeout)
        calls: dict[str, int] = {}
        bytes_read = 0
        for _, store in made:
            if store is not None:
                for op, count in store.calls.items():
                    calls[op] = calls.get(op, 0) + count
                bytes_read += store.bytes_read
        sealers = [i for i, (handler, _) in zip(indices, made, strict=True)
                   if getattr(getattr(handler, "_view", None), "whole", False)]  # fmt: skip
        conn.send(("done", results, calls, bytes_read, _cpu_seconds() - cpu_before, sealers))
        command = conn.recv()
        if command[0] == "lose":
            _, victim, lose_at = command
            cpu_before = _cpu_seconds()
            survivors = [k for k, i in enumerate(indices) if i != victim]
            if len(survivors) < len(indices):
                _vanish(made[indices.index(victim)][0], lose_at)
            found = _in_threads(len(survivors), lambda j: _after_loss(made[survivors[j]][0], lose_at + timeout),
                                lose_at + timeout)  # fmt: skip
            conn.send(("rejoined", found, _cpu_seconds() - cpu_before))
    except BaseException as err:
        conn.send(("error", f"{type(err).__name__}: {err}"))
    finally:
        conn.close()
        os._exit(0)  # no orderly shutdown of N handlers: the next measurement needs the CPU


def _in_threads(count: int, work: Callable[[int], Any], deadline: float) -> list[Any]:
    """`work(k)` for k in range(count), one thread each; what each returned (None: not done by `deadline`)."""
    results: list[Any] = [None] * count

    def run(k: int) -> None:
        results[k] = work(k)

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(deadline - time.time(), 0.01))
    return results


def _time_joins(handler: Any) -> None:
    """Note when the member last wrote its member key (its join; etcd-v3 only), in `handler.joined_at`."""
    run = getattr(handler, "run", None)
    if run is None:
        return
    put_member = run.put_member

    def timed(*args: Any, **kwargs: Any) -> int:
        revision = put_member(*args, **kwargs)
        handler.joined_at = time.time()
        return revision

    run.put_member = timed
    handler.joined_at = None


def _rendezvous(handler: Any, at: float) -> tuple[float, int, int, str | None, float | None]:
    """(when it returned, rank, world size, error, when it last wrote its member key) of one `next_rendezvous()`
    started at `at`."""
    delay = at - time.time()
    if delay > 0:
        time.sleep(delay)
    try:
        info = handler.next_rendezvous()
        return (time.time(), info.rank, info.world_size, None, getattr(handler, "joined_at", None))
    except Exception as err:
        return (time.time(), -1, -1, f"{type(err).__name__}: {err}", None)


def _vanish(handler: Any, at: float) -> None:
    """At `at`, the member dies as a crashed node does: no more keep-alives (its lease lapses after its TTL, and
    its key with it), no more answers. Nothing is revoked and nothing says goodbye."""
    time.sleep(max(at - time.time(), 0.0))
    handler._shut_down = True  # its incident-answering thread stops
    handler._member_lease.stop()
    handler._view.close()


def _after_loss(handler: Any, deadline: float) -> tuple[float, int, int, str | None, float | None]:
    """What the in-place agent does while training: sleep on the handler's change signal (readable whenever
    the job's keys it watches move), ask `num_nodes_waiting()` when woken (and once a second at the latest);
    once a change is seen, rendezvous again. (as `_rendezvous` returns)

    Waiting on the signal rather than polling every 0.1 s keeps 1,024 simulated agents from spending this
    machine's CPU on 10,000 polls a second, which a real job spreads over its nodes."""
    while True:
        handler.changes.clear()
        if handler.num_nodes_waiting() > 0:
            return _rendezvous(handler, 0.0)
        if time.time() > deadline:
            return (time.time(), -1, -1, "no membership change seen", None)
        wait([handler.changes], timeout=MONITOR_SECONDS)


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
    events: float = math.nan  # watch events etcd delivered in the round (etcd-v3)
    loss: Round | None = None  # one member lost, the others in the next round (etcd-v3)
    joined: float | None = None  # seconds from the start until the last member wrote its member key (etcd-v3)


@dataclass
class Round:
    """What one round cost etcd: from a start (the common start, a member's loss) to the last member ranked."""

    seconds: float | None
    requests: float
    events: float
    bytes_sent: float
    server_cpu: float
    client_cpu: float
    note: str = ""
    # seconds from the loss until the round ended (the next round's record says when it opened): the lease's
    # share of `seconds`; the rest is the protocol's, which the issue bounds at 2 s
    ended: float | None = None


PRELOAD = ["torch", "torch.distributed.elastic.rendezvous.dynamic_rendezvous",
           "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend", "elastic.rendezvous.handler"]


def measure(backend: str, n: int, repeat: int, per_proc: int, etcd_url: str, etcd_pid: int | None,
            timeout: float, conf: dict[str, Any], lose: str | None) -> Measurement:
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
        worker = ctx.Process(target=member_process,
                             args=(child, backend, endpoint, run_id, n, indices, timeout, conf))  # fmt: skip
        worker.start()
        child.close()
        pipes.append(parent)
        workers.append(worker)
    loss = None
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
        sealers: list[int] = []
        server_before = _cpu_seconds(server_pid)
        for conn in pipes:
            message = _receive(conn, timeout + 60, "done")
            results += message[1]
            sealers += message[5]
            for op, count in message[2].items():
                calls[op] = calls.get(op, 0) + count
            bytes_read += message[3]
            client_cpu += message[4]
        after = metrics.sample()
        server_cpu = _cpu_seconds(server_pid) - server_before
        seconds, joined, note = _ranked(results, n, go_at, timeout)
        if lose and backend == "etcd-v3" and seconds is not None:
            victims = sealers if lose == "sealer" else []
            loss = _lose_one(pipes, groups, results, n, metrics, server_pid, timeout, victims,
                             _round_opened_at(etcd_url, run_id))
        else:
            for conn in pipes:
                conn.send(("stop",))
    finally:
        for worker in workers:
            worker.join(10)
            if worker.is_alive():
                worker.kill()
                worker.join()
    if backend == "etcd-v3":
        delta = common.EtcdMetrics.delta(before, after)
        detail = common.EtcdMetrics.by_method(delta)
        return Measurement(backend, n, repeat, seconds, common.EtcdMetrics.requests(delta),
                           delta.get("bytes_sent", 0.0), detail, note, client_cpu, server_cpu,
                           delta.get("events_sent", math.nan), loss, joined)  # fmt: skip
    del server
    return Measurement(backend, n, repeat, seconds, float(sum(calls.values())), bytes_read,
                       {k: float(v) for k, v in sorted(calls.items())}, note, client_cpu, server_cpu)


def _receive(conn: Any, timeout: float, kind: str) -> Any:
    if not conn.poll(timeout):
        raise RuntimeError(f"a member process did not report {kind!r}")
    message = conn.recv()
    if message[0] != kind:
        raise RuntimeError(f"member process failed: {message[1]}")
    return message


def _ranked(results: list[Any], n: int, start: float, timeout: float) -> tuple[float | None, float | None, str]:
    """Seconds from `start` until every member held its rank of a round of `n` (None: not all did), seconds from
    `start` until the last of them wrote its member key (its join: etcd-v3), and why not all were ranked."""
    done = [r for r in results if r is not None and r[3] is None]
    errors = sorted({r[3] for r in results if r is not None and r[3] is not None})
    complete = len(done) == n and sorted(r[1] for r in done) == list(range(n)) and all(r[2] == n for r in done)
    if complete:
        joins = [r[4] for r in done if r[4] is not None]
        return max(r[0] for r in done) - start, (max(joins) - start if len(joins) == n else None), ""
    return None, None, f"{len(done)}/{n} members got a rank within {timeout:g} s; {'; '.join(errors)[:300]}"


def _round_opened_at(etcd_url: str, run_id: str) -> Callable[[], float | None]:
    """When the job's current round opened (its record's `opened_at`), as a function to call later: one key,
    not the job's whole prefix (1,024 member keys)."""
    from elastic.rendezvous.state import Round
    from elastic.spec.names import job_name_for
    from elastic.store import JobKeys, Store

    def opened_at() -> float | None:
        with Store(etcd_url) as store:
            entry = store.get(JobKeys("default", job_name_for(run_id)).round)
        return Round.decode(entry).opened_at if entry is not None else None

    return opened_at


def _lose_one(pipes: list[Any], groups: list[list[int]], results: list[Any], n: int, metrics: common.EtcdMetrics,
              server_pid: int | None, timeout: float, sealers: list[int],
              opened_at: Callable[[], float | None]) -> Round:
    """The member at rank n // 2 (or the sealer, when `sealers` names it) dies (its keep-alives stop); the others
    notice through the round (or the sealer key's loss) and rejoin. Seconds from its death to the last survivor
    ranked in a round of n - 1 (its lease must lapse first)."""
    order = [i for group in groups for i in group]  # results come back in this order
    victim = sealers[0] if sealers else next(i for i, r in zip(order, results, strict=True) if r[1] == n // 2)
    before, server_before = metrics.sample(), _cpu_seconds(server_pid)
    lose_at = time.time() + 0.5
    for conn in pipes:
        conn.send(("lose", victim, lose_at))
    found: list[Any] = []
    client_cpu = 0.0
    for conn in pipes:
        message = _receive(conn, timeout + 60, "rejoined")
        found += message[1]
        client_cpu += message[2]
    delta = common.EtcdMetrics.delta(before, metrics.sample())
    seconds, _, note = _ranked(found, n - 1, lose_at, timeout)
    ended = opened_at() if seconds is not None else None
    return Round(seconds, common.EtcdMetrics.requests(delta), delta.get("events_sent", math.nan),
                 delta.get("bytes_sent", 0.0), _cpu_seconds(server_pid) - server_before, client_cpu, note,
                 ended - lose_at if ended is not None else None)


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
    out = ["\n## Rendezvous of N members (nnodes N-1:N), seconds until every member holds its rank"]
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
    per_member, member_results = per_member_report(args.sizes, [m for m in rows if m.backend == "etcd-v3"])
    out += per_member
    failed = [m for m in rows if m.seconds is None]
    if failed:
        out.append("\nIncomplete runs: " + "; ".join(f"{m.backend} N={m.n} #{m.repeat + 1}: {m.note}" for m in failed))
    lost = [m for m in rows if m.loss is not None and m.loss.seconds is None]
    if lost:
        out.append("\nIncomplete rounds after a loss: "
                   + "; ".join(f"N={m.n} #{m.repeat + 1}: {m.loss.note}" for m in lost))  # type: ignore[union-attr]
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        common.write_csv(args.out / "scale_runs.csv", [_csv_row(m) for m in rows])
        out.append("\n" + common.bar_chart(args.out / "scale.png",
                                           f"Rendezvous of N members (s), median and min-max, {env['machine']}",
                                           "seconds (log)", chart, log=True))
    out.append("")
    out += results
    out.append(f"SCALING requests_per_round etcd-v3=N^{exps['etcd-v3']:.2f} c10d=N^{exps['c10d']:.2f}")
    out += member_results
    return out


def per_member_report(sizes: list[int], rows: list[Measurement]) -> tuple[list[str], list[str]]:
    """etcd-v3's cost per member per round (etcd's own counters / N), for the round that ranks N members and
    for the round after one of them is lost: the table, and one RESULT line per N (medians over repeats)."""
    table_rows, results = [], []
    for n in sizes:
        mine = [m for m in rows if m.n == n and m.seconds is not None]
        if not mine:
            continue
        losses = [m.loss for m in mine if m.loss is not None]
        ranked = common.Summary.of([m.seconds for m in mine]).median
        per = {name: common.Summary.of([getattr(m, name) / n for m in mine]).median
               for name in ("requests", "events", "bytes_read")}  # fmt: skip
        loss_s = common.Summary.of([r.seconds for r in losses]).median
        # the target's reading: from the last member's join (its member key written) to every member ranked
        settle = common.Summary.of([_seconds_after(m.seconds, m.joined) for m in mine]).median
        # the reading of a loss: the round ends within the lease, and survivors are ranked within 2 s
        loss_settle = common.Summary.of([_seconds_after(r.seconds, r.ended) for r in losses]).median
        loss = {name: common.Summary.of([getattr(r, name) / (n - 1) for r in losses if r.seconds is not None]).median
                for name in ("requests", "events", "bytes_sent")}  # fmt: skip
        table_rows.append((
            n, f"{ranked:.2f}", _seconds(settle), f"{per['requests']:.1f}", f"{per['events']:.0f}",
            f"{per['bytes_read'] / 1024:.1f}",
            f"{common.Summary.of([m.server_cpu for m in mine]).median:.1f}",
            _seconds(loss_s), _seconds(loss_settle), f"{loss['requests']:.1f}", f"{loss['events']:.0f}",
            f"{loss['bytes_sent'] / 1024:.1f}",
            f"{common.Summary.of([r.server_cpu for r in losses]).median:.1f}" if losses else "-",
        ))  # fmt: skip
        results.append(f"RESULT rendezvous_members_{n}_s={common.number(ranked)} "
                       f"ranked_after_last_join_s={common.number(settle)} "
                       f"bytes_per_member={per['bytes_read']:.0f} events_per_member={per['events']:.1f} "
                       f"requests_per_member={per['requests']:.1f} loss_to_next_round_s={common.number(loss_s)} "
                       f"loss_ranked_after_round_end_s={common.number(loss_settle)} "
                       f"loss_bytes_per_member={loss['bytes_sent']:.0f} "
                       f"loss_events_per_member={loss['events']:.1f}")  # fmt: skip
    out = ["\n## etcd-v3 per member per round (etcd's /metrics over N): the round that ranks N members, and the "
           "round after one is lost (its keep-alives stop; from then until N - 1 members hold ranks)",
           common.table(["N", "ranked s", "last join -> ranked s", "requests", "watch events", "KiB sent",
                         "etcd CPU s", "loss -> round N-1 s", "round end -> ranked s", "requests", "watch events",
                         "KiB sent", "etcd CPU s"], table_rows)]
    return out, results


def _seconds_after(ranked: float | None, mark: float | None) -> float | None:
    """Seconds from a mark (the last join, a round's end; both from the same start) to every member ranked."""
    return None if ranked is None or mark is None else ranked - mark


def _seconds(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def _csv_row(m: Measurement) -> dict[str, Any]:
    row = common.flattened(m, "detail")
    loss = row.pop("loss")
    return row | ({f"loss_{k}": v for k, v in loss.__dict__.items()} if loss is not None else {})


def _per(value: float, n: int) -> str:
    return "-" if math.isnan(value) else f"{value:.0f} ({value / n:.1f})"


def _kib(value: float) -> str:
    return "-" if math.isnan(value) else f"{value / 1024:.0f} KiB"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="64,256,1024", help="member counts N (default 64,256,1024)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per N and backend (default 3)")
    parser.add_argument("--members-per-proc", type=int, default=0,
                        help="members (threads, one handler and etcd connection each) per worker process (default: "
                             f"N / {PROCESSES}, at least 4: {PROCESSES} processes share the 2 cores)")
    parser.add_argument("--lease-seconds", type=int, default=defaults.LEASE_SECONDS,
                        help=f"etcd-v3 members' lease TTL (default {defaults.LEASE_SECONDS}, the project's)")
    parser.add_argument("--no-loss", action="store_true", help="skip the round after a member's loss")
    parser.add_argument("--own-connections", action="store_true",
                        help="each etcd-v3 member opens its own etcd connection, as an agent process does (default: "
                             "the members of one process share one connection, and so one watch stream and one "
                             "keep-alive stream; each still holds its own lease and watches, makes its own decisions)")
    parser.add_argument("--lose", choices=("member", "sealer"), default="member",
                        help="who dies in the loss round: the member at rank N/2 (default), or the member that "
                             "seals the rounds (the others then elect another)")
    parser.add_argument("--c10d-max", type=int, default=256,
                        help="c10d runs only up to this N (default 256: its store grows as N^2)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one rendezvous may take (default 300)")
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
    print(f"# nnodes N-1:N; members per worker process: {args.members_per_proc or f'N / {PROCESSES}, at least 4'} "
          "(threads, one handler each and "
          f"{'each its own etcd connection' if args.own_connections else 'one etcd connection per process'}); "
          "etcd-v3 lease_seconds="
          f"{args.lease_seconds}; the loss round loses the "
          f"{'sealer' if args.lose == 'sealer' else 'member at rank N/2'}; "
          "stock etcd (no server flags beyond the managed defaults)")
    rows: list[Measurement] = []
    conf = {"lease_seconds": args.lease_seconds, "share_channel": not args.own_connections}
    with common.etcd_server() as etcd:
        for n in args.sizes:
            per_proc = args.members_per_proc or max(4, math.ceil(n / PROCESSES))
            for r in range(args.repeat):
                for backend in args.backends:
                    if backend == "c10d" and n > args.c10d_max:
                        continue
                    m = measure(backend, n, r, per_proc, etcd.client_url, etcd.process.pid, args.timeout, conf,
                                None if args.no_loss else args.lose)  # fmt: skip
                    rows.append(m)
                    took = "none" if m.seconds is None else f"{m.seconds:.2f} s"
                    lost = "" if m.loss is None else (
                        f"; a member lost -> round of {n - 1}: "
                        f"{'none' if m.loss.seconds is None else f'{m.loss.seconds:.2f} s'} "
                        f"(round ended {'?' if m.loss.ended is None else f'{m.loss.ended:.2f} s'} after the loss), "
                        f"{m.loss.events:.0f} events, {m.loss.bytes_sent / 1024:.0f} KiB, CPU members "
                        f"{m.loss.client_cpu:.1f} s, store {m.loss.server_cpu:.1f} s {m.loss.note}")
                    common.log(f"N={n:<4} {backend:<8} #{r + 1}: {took}, {m.requests:.0f} requests, "
                               f"{m.events:.0f} events, {m.bytes_read / 1024:.0f} KiB read, CPU members "
                               f"{m.client_cpu:.1f} s, store {m.server_cpu:.1f} s {m.note}{lost} "
                               + ", ".join(f"{k} {v:.0f}" for k, v in m.detail.items()))
    print("\n".join(report(args, rows, env)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
