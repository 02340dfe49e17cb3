"""What the local controller costs at N jobs on one etcd: `elastic controller --backend external`, status only.

One `LocalControllerManager` (external workers: it decides and reports every job, starts no process) in this
process, driven as `elastic controller` drives it (`run_forever`: the jobs' watch, then `step(1.0)` in a loop);
a real etcd in its own process; the jobs' agents played by a child process, so that this process's CPU time is
the controller's alone. The child writes what real agents write, through the same code (`JobRun.put_member`,
`JobRun.seal`): M member keys per job on one lease it keeps alive, and round 1 sealed with them.

  warm-up   N ElasticJobs of M workers each (minReplicas = maxReplicas = M) are submitted at once; the
            controller creates each job's run, the agents join and seal; the warm-up ends when every job's
            status is Running at world size M (`--warmup` is the most it may take), then `--settle` seconds pass
  window    `--seconds` of steady state, while `--changes` changes spread over the window are made, one job
            each, taking turns: an agent is lost (its member key goes, as when its lease lapses) or the job's
            spec is edited (failurePolicy.maxRestarts + 1, as `elastic scale` edits it); change -> reconcile is
            from the change to the end of the first `JobController.step` of that job after it

etcd requests come from etcd's own /metrics (the agents' lease keep-alive and the changes among them: a few
per minute). RSS is this process's: the controller, its etcd client, and the Python interpreter.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: bench/ is on sys.path, the repo root (bench, harness) is not
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common, probe

NAMESPACE = "bench"
AGENT_LEASE_SECONDS = 10


def job_doc(name: str, workers: int) -> dict[str, Any]:
    return {
        "apiVersion": "elastic.dev/v1alpha1", "kind": "ElasticJob",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"minReplicas": workers, "maxReplicas": workers,
                 "worker": {"command": ["python", "train.py"]}},
    }  # fmt: skip


# --- the agents, in their own process -------------------------------------------------------------


def play_agents(endpoint: str, conn: Connection) -> None:
    """The child: submits the jobs, joins M members per job once its run exists, makes the changes.

    Requests: ("jobs", n, m) submits n jobs of m workers and answers at once; ("join",) joins and seals every
    job whose run exists and which has no sealed round yet, answering how many jobs are sealed; ("running",)
    answers how many jobs' statuses say Running at world size m; ("change", kind, job) makes one change and
    answers when it was made (monotonic, the same clock on this machine as the parent's); ("stop",) ends it.
    """
    from elastic.codec import decode_json_object
    from elastic.controller.submit import submit_job
    from elastic.rendezvous.run import JobRun
    from elastic.spec import parse_job
    from elastic.store import Delete, JobKeys, LeaseKeeper, ModRevisionIs, Put, Store
    from elastic.store.keys import job_keys_prefix

    with Store(endpoint, retry_seconds=10) as store:
        lease = LeaseKeeper.grant(store, AGENT_LEASE_SECONDS)
        names: list[str] = []
        workers = 0
        sealed: set[str] = set()
        conn.send("ready")
        while True:
            message = conn.recv()
            if message[0] == "stop":
                break
            if message[0] == "jobs":
                _, jobs, workers = message
                names = [f"job-{i:04d}" for i in range(jobs)]
                for name in names:
                    submit_job(store, parse_job(job_doc(name, workers)))
                conn.send(len(names))
            elif message[0] == "join":
                for name in names:
                    if name not in sealed and _join(JobRun(store, JobKeys(NAMESPACE, name)), workers, lease):
                        sealed.add(name)
                conn.send(len(sealed))
            elif message[0] == "running":
                entries, _ = store.get_prefix(f"{job_keys_prefix()}{NAMESPACE}/")
                statuses = [decode_json_object(e.key, e.value) for e in entries if e.key.endswith("/status")]
                conn.send(sum(1 for s in statuses if s.get("phase") == "Running" and s.get("worldSize") == workers))
            elif message[0] == "change":
                _, kind, name = message
                keys = JobKeys(NAMESPACE, name)
                made = time.monotonic()
                if kind == "agent":
                    members, _ = store.get_prefix(keys.members_prefix)
                    store.txn([], [Delete(members[-1].key)])
                else:
                    entry = store.get(keys.spec)
                    data = decode_json_object(keys.spec, entry.value)
                    policy = data["spec"].setdefault("failurePolicy", {})
                    policy["maxRestarts"] = int(policy.get("maxRestarts", 3)) + 1
                    store.txn([ModRevisionIs(keys.spec, entry.mod_revision)], [Put.json(keys.spec, data)])
                conn.send(made)
        lease.revoke()


def _join(run: Any, workers: int, lease: Any) -> bool:
    """What M agents of one job do to train: a member key each for the open round, then the seal. False while
    the controller has not created the job's run yet."""
    from elastic.rendezvous.state import Member

    state = run.read()
    current = state.round
    if current is None:
        return False
    if current.sealed:
        return True
    now = time.time()
    for i in range(workers):
        member = Member(id=f"{run.keys.name}-w{i}", target=current.number, host="bench", addr="127.0.0.1",
                        pid=i, joined_at=now + i * 1e-3, worker=f"{run.keys.name}-w{i}")  # fmt: skip
        run.put_member(member, lease.lease_id)
    state = run.read()
    return run.seal(state, state.round, {f"{run.keys.name}-w{i}": i for i in range(workers)})


# --- the controller, in this process --------------------------------------------------------------


@dataclass
class Measurement:
    jobs: int
    workers: int
    seconds: float = 0.0
    warmup_s: float = float("nan")
    cpu_s: float = 0.0
    etcd_requests: float = float("nan")
    etcd_by_method: dict[str, float] = field(default_factory=dict)
    job_steps: int = 0
    change_latency: dict[str, list[float]] = field(default_factory=dict)
    unreconciled: int = 0
    rss_mib: float = float("nan")
    peak_rss_mib: float = float("nan")

    def per_min(self, value: float) -> float:
        return value * 60.0 / self.seconds if self.seconds else float("nan")


def measure(args: argparse.Namespace, etcd: Any) -> Measurement:
    from elastic.controller.manager import LocalControllerManager
    from elastic.store import Store

    result = Measurement(args.jobs, args.workers)
    agents = probe.ChildProcess(play_agents, (etcd.client_url,), "the agents' process", 300, 15)
    stop = threading.Event()
    with Store(etcd.client_url, retry_seconds=5) as store, tempfile.TemporaryDirectory() as logs:
        manager = LocalControllerManager(store, etcd.client_url, Path(logs), external_workers=True)
        job_steps = probe.JobSteps()
        events = manager.watch_jobs()

        def run() -> None:  # `elastic controller`'s loop (run_forever), until the bench ends
            while not stop.is_set():
                manager.step(wait=1.0)

        loop = threading.Thread(target=run, name="controller", daemon=True)
        loop.start()
        try:
            t0 = time.monotonic()
            agents.ask("jobs", args.jobs, args.workers)
            common.log(f"{args.jobs} jobs x {args.workers} workers submitted")
            running, last_report = 0, t0
            while running < args.jobs:
                if time.monotonic() - t0 > args.warmup:
                    raise RuntimeError(f"warm-up: {running} of {args.jobs} jobs Running after {args.warmup:g} s")
                sealed = agents.ask("join")
                running = agents.ask("running")
                if time.monotonic() - last_report >= 10:
                    last_report = time.monotonic()
                    common.log(f"warm-up: {sealed} jobs sealed, {running} Running")
                time.sleep(1.0)
            result.warmup_s = time.monotonic() - t0
            common.log(f"all {args.jobs} jobs Running after {result.warmup_s:.1f} s; settling {args.settle:g} s")
            time.sleep(args.settle)

            metrics = common.EtcdMetrics(etcd.client_url)
            etcd_before, steps_before = metrics.sample(), job_steps.count
            w0, cpu0 = time.monotonic(), time.process_time()
            changes: list[tuple[str, str, float]] = []
            while len(changes) < args.changes:
                due = w0 + (len(changes) + 0.5) * args.seconds / args.changes
                time.sleep(max(due - time.monotonic(), 0.0))
                kind = ("agent", "spec")[len(changes) % 2]
                job = f"job-{(len(changes) * 7919) % args.jobs:04d}"  # spread over the jobs
                changes.append((kind, job, agents.ask("change", kind, job)))
            time.sleep(max(w0 + args.seconds - time.monotonic(), 0.0))
            cpu1, w1 = time.process_time(), time.monotonic()
            result.rss_mib, result.peak_rss_mib = probe.rss_mib()
            delta = common.EtcdMetrics.delta(etcd_before, metrics.sample())
            result.job_steps = job_steps.count - steps_before
            for kind, job, made in changes:
                ended = job_steps.first_after(job, made)
                if ended is None:
                    result.unreconciled += 1
                else:
                    result.change_latency.setdefault(kind, []).append(ended - made)
        finally:
            stop.set()
            loop.join(10)
            events.close()
            agents.stop()
    result.seconds, result.cpu_s = w1 - w0, cpu1 - cpu0
    result.etcd_requests = common.EtcdMetrics.requests(delta)
    result.etcd_by_method = common.EtcdMetrics.by_method(delta)
    return result


def report(m: Measurement, code: str) -> list[str]:
    every = [v for values in m.change_latency.values() for v in values]
    by_method = ", ".join(f"{k} {m.per_min(v):.0f}" for k, v in sorted(m.etcd_by_method.items()) if v) or "-"
    out = [f"\n## Local controller (--backend external) at {m.jobs} jobs x {m.workers} workers, "
           f"{m.seconds:.1f} s window", f"# code under test: {code}"]  # fmt: skip
    out.append(common.table(["metric", "value"], [
        ("controller CPU s per minute (this process)", f"{m.per_min(m.cpu_s):.2f}"),
        ("etcd requests per minute (etcd /metrics)", f"{m.per_min(m.etcd_requests):.0f}"),
        ("  by method, per minute", by_method),
        ("jobs reconciled per minute (JobController.step)", f"{m.per_min(m.job_steps):.0f}"),
        ("warm-up: jobs submitted -> all Running, s", f"{m.warmup_s:.1f}"),
        ("controller RSS at the end of the window / peak, MiB", f"{m.rss_mib:.0f} / {m.peak_rss_mib:.0f}"),
        *((f"change -> reconcile, {kind}, s (p50, p99, max; n)", probe.latency_text(values))
          for kind, values in sorted(m.change_latency.items())),
        ("changes never reconciled by the end", m.unreconciled),
    ]))  # fmt: skip
    out += ["", f"RESULT local_controller_scale jobs={m.jobs} workers={m.workers} "
                f"cpu_s_per_min={m.per_min(m.cpu_s):.3f} etcd_requests_per_min={m.per_min(m.etcd_requests):.1f} "
                f"jobs_reconciled_per_min={m.per_min(m.job_steps):.0f} rss_mib={m.rss_mib:.0f} "
                f"peak_rss_mib={m.peak_rss_mib:.0f} change_to_reconcile_p50_s={probe.percentile(every, 50):.3f} "
                f"change_to_reconcile_p99_s={probe.percentile(every, 99):.3f} changes={len(every) + m.unreconciled} "
                f"unreconciled={m.unreconciled}"]  # fmt: skip
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100, help="ElasticJobs (default 100)")
    parser.add_argument("--workers", type=int, default=8, help="workers (agents) per job (default 8)")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window in seconds (default 60)")
    parser.add_argument("--warmup", type=float, default=600.0,
                        help="most seconds from submitting the jobs until all are Running (default 600)")
    parser.add_argument("--changes", type=int, default=40,
                        help="changes made in the window, an agent lost and a spec edit in turn (default 40)")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before the window (default 5)")
    args = parser.parse_args(argv)
    if min(args.jobs, args.workers, args.changes) < 1 or args.seconds <= 0 or args.warmup <= 0 or args.settle < 0:
        parser.error("--jobs, --workers and --changes must be >= 1, --seconds and --warmup > 0, --settle >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common.exit_cleanly_on_sigterm()
    import elastic.controller.manager as manager
    from elastic.store.server import EtcdServer

    common.print_environment(common.environment())
    with EtcdServer() as etcd:
        result = measure(args, etcd)
    print("\n".join(report(result, manager.__file__)))
    return 0 if not result.unreconciled and not math.isnan(result.warmup_s) else 1


if __name__ == "__main__":
    sys.exit(main())
