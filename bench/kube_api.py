"""What the Kubernetes controller costs the API server and itself: requests and CPU per minute at N jobs x M pods.

One replica of `KubernetesControllerManager` against the FAKE API server (tests/kubernetes/fake_api.py, found
next to the `elastic` package imported, so a worktree of an older commit measures its own fake), and a real
etcd. The fake runs in a child process (multiprocessing, spawn) which also plays the kubelet: every 0.5 s
each Pending pod is marked Running. etcd is its own process as well, so the CPU time of this process is the
controller's alone: its pass loop on the main thread, its Lease renewal, informers and etcd client threads.

  warm-up   N ElasticJobs of M workers each (minReplicas = maxReplicas = M) are created at once; the
            controller makes their N x M pods, the kubelet runs them; the warm-up ends when all are Running
            (`--warmup` is the most it may take), then `--settle` seconds pass for the statuses to follow
  window    `--seconds` of steady state: the controller keeps every job converged, while `--changes` changes
            spread over the window are made, one job each, taking turns: a worker pod fails (exit 1: the job
            charges one restart and replaces the pod) or the job's spec is edited (failurePolicy.maxRestarts);
            change -> reconcile is from the change to the end of the first `JobController.step` of that job
            after it (the controller's own pass made the change visible to nothing but its watches)

Requests are counted in this process by wrapping the `ApiClient`'s `rest_client.request` (method and path:
a GET with `watch=true` is a watch, a GET of a collection a list, of a name a get; POST create, PUT update,
PATCH patch, DELETE delete) and cross-checked against the requests the fake recorded; etcd requests come
from etcd's own /metrics. The manager is driven as `elastic controller` drives it: `step(1.0)` in a loop
(the informer-based API), or `step()` then a 1 s sleep (the 1 s poll before commit 89075ff: told apart by
`step`'s signature, so the same script measures both).
"""

from __future__ import annotations

import argparse
import inspect
import math
import re
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

if not __package__:  # run as a script: bench/ is on sys.path, the repo root (bench, harness) is not
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common, probe

NAMESPACE = "bench"
KUBELET_SECONDS = 0.5
VERBS = ("list", "watch", "get", "create", "update", "patch", "delete")
RESOURCES = ("elasticjobs", "pods", "leases", "events")
_PATH = re.compile(
    r"^/(?:api/v1|apis/[^/]+/[^/]+)(?:/namespaces/[^/]+)?/(?P<res>[a-z]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[a-z]+))?)?$"
)


# --- what one request is (pure) ------------------------------------------------------------------


def request_kind(method: str, url: str, query: Any = None) -> tuple[str, str]:
    """(verb, resource) of one API request, as RBAC names them: `("watch", "pods")`, `("patch", "elasticjobs")`.

    `query`: the query parameters when a client passes them apart from the URL (older `kubernetes` clients).
    """
    parts = urlsplit(url)
    params = parse_qs(parts.query)
    for key, value in (query.items() if isinstance(query, dict) else query or []):
        params.setdefault(key, []).append(str(value))
    match = _PATH.match(parts.path)
    resource = match["res"] if match else "other"
    named = bool(match and match["name"])
    if method.upper() == "GET":
        watching = any(v.lower() in ("true", "1") for v in params.get("watch", []))
        verb = "watch" if watching else ("get" if named else "list")
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method.upper(), "other")
    return verb, resource


class RequestCounter:
    """Counts every request an `ApiClient` sends, by (verb, resource), on whichever thread sends it."""

    def __init__(self, api_client: Any) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        send = api_client.rest_client.request

        def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            kind = request_kind(method, url, kwargs.get("query_params"))
            with self._lock:
                self.counts[kind] += 1
            return send(method, url, *args, **kwargs)

        api_client.rest_client.request = request

    def snapshot(self) -> Counter[tuple[str, str]]:
        with self._lock:
            return Counter(self.counts)


# --- the API server and the kubelet, in their own process -----------------------------------------


def job_doc(name: str, pods: int) -> dict[str, Any]:
    return {
        "apiVersion": "elastic.dev/v1alpha1", "kind": "ElasticJob",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"minReplicas": pods, "maxReplicas": pods,
                 "worker": {"command": ["python", "train.py"], "image": "trainer:1"}},
    }  # fmt: skip


def serve_fake(fake_dir: str, conn: Connection) -> None:
    """The child process: the fake API server, the kubelet (Pending -> Running), and answers to the parent.

    Requests from the parent: ("jobs", n, m) creates n jobs of m workers; ("counts",) answers the pods, how
    many run, the requests the fake recorded by verb and this process's CPU seconds; ("stop",) ends it.
    """
    sys.path.insert(0, fake_dir)
    from fake_api import FakeApiServer  # the fake of the code under test (tests/kubernetes/ beside it)

    fake = FakeApiServer(rbac=None)
    # TCP_NODELAY, as kube-apiserver's Go net/http sets it: with Nagle on, http.server's separate header and
    # body writes hold every response of some kilobytes ~40 ms for the client's delayed ACK (a 100-pod-list
    # pass of the poll took 5.5 s instead of 0.95 s), which would measure the fake's sockets, not the controller
    fake.httpd.RequestHandlerClass.disable_nagle_algorithm = True
    fake.start()
    conn.send(fake.url)
    try:
        while True:
            if conn.poll(KUBELET_SECONDS):
                message = conn.recv()
                if message[0] == "stop":
                    break
                if message[0] == "jobs":
                    _, jobs, pods = message
                    for i in range(jobs):
                        fake.add_job(job_doc(f"job-{i:03d}", pods))
                    conn.send(jobs)
                elif message[0] == "change":
                    conn.send(_change(fake, message[1], message[2]))
                elif message[0] == "counts":
                    with fake.lock:
                        phases = Counter((p.get("status") or {}).get("phase") for p in fake.pods.values())
                        verbs = Counter(verb for _, _, verb in fake.requests)
                    conn.send({"pods": sum(phases.values()), "running": phases["Running"], "verbs": dict(verbs),
                               "cpu_s": time.process_time()})  # fmt: skip
            _kubelet(fake)
    finally:
        fake.stop()


def _change(fake: Any, kind: str, job: str) -> str:
    """One change to `job`: a running worker pod fails (exit 1), or the spec is edited (maxRestarts + 1)."""
    with fake.lock:
        if kind == "pod":
            running = sorted(name for name, pod in fake.pods_of(job, NAMESPACE).items()
                             if (pod.get("status") or {}).get("phase") == "Running")  # fmt: skip
            if not running:
                return ""
            fake.set_pod(running[0], "Failed", exit_code=1, namespace=NAMESPACE)
            return running[0]
        obj = fake.jobs[(NAMESPACE, job)]
        policy = obj["spec"].setdefault("failurePolicy", {})
        policy["maxRestarts"] = int(policy.get("maxRestarts", 3)) + 1
        obj["metadata"]["generation"] = int(obj["metadata"].get("generation", 1)) + 1
        fake._changed("elastic.dev", "elasticjobs", "MODIFIED", obj)
        return job


def _kubelet(fake: Any) -> None:
    """Every Pending pod not being deleted starts Running (set_pod and the pods dict: old and new fakes)."""
    with fake.lock:
        pending = [key for key, pod in fake.pods.items()
                   if (pod.get("status") or {}).get("phase", "Pending") == "Pending"
                   and not pod["metadata"].get("deletionTimestamp")]  # fmt: skip
        for namespace, name in pending:
            fake.set_pod(name, "Running", namespace=namespace)


def fake_process(fake_dir: Path) -> probe.ChildProcess:
    """The fake API server in its child; `.first` is its URL."""
    return probe.ChildProcess(serve_fake, (str(fake_dir),), "the fake API server", 60, 10)


# --- the controller, in this process --------------------------------------------------------------


@dataclass
class Measurement:
    jobs: int
    pods: int
    seconds: float = 0.0  # the window actually measured
    warmup_s: float = float("nan")
    requests: Counter[tuple[str, str]] = field(default_factory=Counter)  # in the window, client-side
    warmup_requests: Counter[tuple[str, str]] = field(default_factory=Counter)
    server_requests: int = 0  # in the window, as the fake recorded them
    cpu_s: float = 0.0
    fake_cpu_s: float = 0.0
    etcd_requests: float = float("nan")
    passes: int = 0
    job_steps: int = 0  # JobController.step calls in the window
    pass_seconds: list[float] = field(default_factory=list)  # the poll's passes, without the 1 s sleep
    api: str = ""
    change_latency: dict[str, list[float]] = field(default_factory=dict)  # kind -> change -> reconcile, s
    unreconciled: int = 0  # changes with no step of their job after them by the end
    rss_mib: float = float("nan")
    peak_rss_mib: float = float("nan")

    def per_min(self, value: float) -> float:
        return value * 60.0 / self.seconds if self.seconds else float("nan")


def _stepper(manager: Any, pass_seconds: list[float]) -> tuple[str, Any]:
    """One pass as `elastic controller` makes it: step(1.0) (informers), or step() then 1 s (the poll, whose
    passes' own durations go to `pass_seconds`)."""
    if "wait" in inspect.signature(manager.step).parameters:
        return "informers: step(1.0)", lambda: manager.step(1.0)

    def poll() -> bool:
        t = time.monotonic()
        acted = manager.step()
        pass_seconds.append(time.monotonic() - t)
        time.sleep(1.0)
        return bool(acted)

    return "1 s poll: step(); sleep(1)", poll


def measure(args: argparse.Namespace, fake: probe.ChildProcess, etcd: Any) -> Measurement:
    from kubernetes import client

    from elastic.controller.kube_manager import KubernetesControllerManager
    from elastic.store import Store

    try:
        from elastic.cluster.kubernetes import BoundedApiClient as ControllerClient  # every request bounded
    except ImportError:  # the code from before issue 23 (see README, Performance)
        ControllerClient = client.ApiClient

    result = Measurement(args.jobs, args.pods)
    total = args.jobs * args.pods
    with ControllerClient(client.Configuration(host=fake.first)) as api_client, \
            Store(etcd.client_url, retry_seconds=5) as store:  # fmt: skip
        counter = RequestCounter(api_client)
        manager = KubernetesControllerManager(store, etcd.client_url, api_client, "bench-controller",
                                              "elastic-system").start()  # fmt: skip
        job_steps, pass_seconds = probe.JobSteps(), []
        result.api, step = _stepper(manager, pass_seconds)
        try:
            deadline = time.monotonic() + 60
            while not step():
                if time.monotonic() > deadline:
                    raise RuntimeError("the single replica did not lead within 60 s")
            common.log(f"leading ({result.api}); creating {args.jobs} jobs x {args.pods} pods")
            t0 = time.monotonic()
            fake.ask("jobs", args.jobs, args.pods)
            counts = fake.ask("counts")
            last_report = t0
            while counts["running"] < total:
                if time.monotonic() - t0 > args.warmup:
                    raise RuntimeError(f"warm-up: {counts['running']} of {total} pods Running after {args.warmup:g} s")
                step()
                counts = fake.ask("counts")
                if time.monotonic() - last_report >= 10:
                    last_report = time.monotonic()
                    common.log(f"warm-up: {counts['pods']} pods, {counts['running']} Running")
            result.warmup_s = time.monotonic() - t0
            common.log(f"all {total} pods Running after {result.warmup_s:.1f} s; settling {args.settle:g} s")
            settle_until = time.monotonic() + args.settle
            while time.monotonic() < settle_until:
                step()
            result.warmup_requests = counter.snapshot()

            metrics = common.EtcdMetrics(etcd.client_url)
            etcd_before, fake_before = metrics.sample(), fake.ask("counts")
            requests_before, w0, cpu0 = counter.snapshot(), time.monotonic(), time.process_time()
            steps_before, pass_seconds[:] = job_steps.count, []
            changes: list[tuple[str, str, float]] = []  # (kind, job, when made)
            while time.monotonic() - w0 < args.seconds:
                due = w0 + (len(changes) + 0.5) * args.seconds / args.changes if args.changes else math.inf
                if len(changes) < args.changes and time.monotonic() >= due:
                    kind = ("pod", "spec")[len(changes) % 2]
                    job = f"job-{(len(changes) * 7919) % args.jobs:03d}"  # spread over the jobs
                    made = time.monotonic()
                    if fake.ask("change", kind, job):
                        changes.append((kind, job, made))
                step()
                result.passes += 1
            cpu1, w1, requests_after = time.process_time(), time.monotonic(), counter.snapshot()
            result.rss_mib, result.peak_rss_mib = probe.rss_mib()
            for kind, job, made in changes:
                ended = job_steps.first_after(job, made)
                if ended is None:
                    result.unreconciled += 1
                else:
                    result.change_latency.setdefault(kind, []).append(ended - made)
            result.job_steps, result.pass_seconds = job_steps.count - steps_before, list(pass_seconds)
            etcd_after, fake_after = metrics.sample(), fake.ask("counts")
        finally:
            manager.close()
    result.seconds = w1 - w0
    result.cpu_s = cpu1 - cpu0
    result.requests = requests_after - requests_before
    result.server_requests = sum(fake_after["verbs"].values()) - sum(fake_before["verbs"].values())
    result.fake_cpu_s = fake_after["cpu_s"] - fake_before["cpu_s"]
    result.etcd_requests = common.EtcdMetrics.requests(common.EtcdMetrics.delta(etcd_before, etcd_after))
    if fake_after["running"] != total:
        common.log(f"note: {fake_after['running']} of {total} pods Running at the end of the window")
    return result


# --- the report -----------------------------------------------------------------------------------


def report(result: Measurement, code: str) -> list[str]:
    m = result
    by_verb = Counter({verb: 0 for verb in VERBS})
    by_resource: Counter[str] = Counter()
    for (verb, resource), n in m.requests.items():
        by_verb[verb] += n
        by_resource[resource] += n
    total = sum(m.requests.values())
    out = [f"\n## Kubernetes controller at {m.jobs} jobs x {m.pods} pods ({m.jobs * m.pods} pods), "
           f"{m.seconds:.1f} s window, {m.passes} passes; {m.api}",
           f"# code under test: {code}"]  # fmt: skip
    rows = [(verb, by_verb[verb], f"{m.per_min(by_verb[verb]):.1f}",
             ", ".join(f"{r} {n}" for (v, r), n in sorted(m.requests.items()) if v == verb and n) or "-")
            for verb in sorted(by_verb, key=lambda v: (VERBS.index(v) if v in VERBS else len(VERBS), v))]
    rows.append(("total", total, f"{m.per_min(total):.1f}", f"the fake recorded {m.server_requests}"))
    out.append(common.table(["verb", "requests in window", "per minute", "by resource (in window)"], rows))
    warm = sum(m.warmup_requests.values())
    every = [v for values in m.change_latency.values() for v in values]
    out.append("\n" + common.table(["metric", "value"], [
        ("controller CPU s per minute (this process)", f"{m.per_min(m.cpu_s):.2f}"),
        ("fake API server + kubelet CPU s per minute (child)", f"{m.per_min(m.fake_cpu_s):.2f}"),
        ("etcd requests per minute (etcd /metrics)", f"{m.per_min(m.etcd_requests):.0f}"),
        ("jobs reconciled per minute (JobController.step)", f"{m.per_min(m.job_steps):.0f}"),
        ("controller CPU ms per job reconciled", f"{1000 * m.cpu_s / m.job_steps:.2f}" if m.job_steps else "-"),
        ("a pass of the poll, s (median [min-max], sleep excluded)",
         common.Summary.of(m.pass_seconds).text(2) if m.pass_seconds else "- (no poll)"),
        ("warm-up: jobs created -> all pods Running, s", f"{m.warmup_s:.1f}"),
        ("API requests from start to the window", warm),
        ("controller RSS at the end of the window / peak, MiB", f"{m.rss_mib:.0f} / {m.peak_rss_mib:.0f}"),
        *((f"change -> reconcile, {kind}, s (p50, p99, max; n)", probe.latency_text(values))
          for kind, values in sorted(m.change_latency.items())),
        ("changes never reconciled by the end", m.unreconciled),
    ]))  # fmt: skip
    values = " ".join(f"{verb}={m.per_min(by_verb[verb]):.1f}" for verb in by_verb)
    resources = " ".join(f"{r}={m.per_min(by_resource[r]):.1f}" for r in sorted(set(RESOURCES) | set(by_resource)))
    out += ["",
            f"RESULT kube_api_requests_per_min total={m.per_min(total):.1f} {values} "
            f"cpu_s_per_min={m.per_min(m.cpu_s):.3f} etcd_requests_per_min={m.per_min(m.etcd_requests):.1f} "
            f"jobs_reconciled_per_min={m.per_min(m.job_steps):.0f} warmup_s={m.warmup_s:.1f} "
            f"jobs={m.jobs} pods={m.pods}",
            f"RESULT kube_controller_scale jobs={m.jobs} pods={m.pods} cpu_s_per_min={m.per_min(m.cpu_s):.3f} "
            f"rss_mib={m.rss_mib:.0f} peak_rss_mib={m.peak_rss_mib:.0f} "
            f"change_to_reconcile_p50_s={probe.percentile(every, 50):.3f} "
            f"change_to_reconcile_p99_s={probe.percentile(every, 99):.3f} changes={len(every) + m.unreconciled} "
            f"unreconciled={m.unreconciled}",
            f"RESULT kube_api_requests_per_min_by_resource {resources}"]  # fmt: skip
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100, help="ElasticJobs (default 100)")
    parser.add_argument("--pods", type=int, default=16, help="worker pods per job (default 16)")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window in seconds (default 60)")
    parser.add_argument("--warmup", type=float, default=300.0,
                        help="most seconds from creating the jobs until all pods run (default 300)")
    parser.add_argument("--changes", type=int, default=40,
                        help="changes made in the window, a pod failing and a spec edit in turn (default 40)")
    parser.add_argument("--settle", type=float, default=5.0,
                        help="seconds after all pods run before the window, for statuses to follow (default 5)")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.pods < 1 or args.seconds <= 0 or args.warmup <= 0 or args.settle < 0 or args.changes < 0:
        parser.error("--jobs and --pods must be >= 1, --seconds and --warmup > 0, --settle and --changes >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common.exit_cleanly_on_sigterm()
    import elastic.controller.kube_manager as kube_manager
    from elastic.store.server import EtcdServer

    code = f"{kube_manager.__file__}"
    fake_dir = Path(kube_manager.__file__).resolve().parents[2] / "tests" / "kubernetes"
    common.print_environment(common.environment())
    print(f"# controller: {code}\n# fake: {fake_dir / 'fake_api.py'}")
    fake = fake_process(fake_dir)
    try:
        with EtcdServer() as etcd:
            result = measure(args, fake, etcd)
    finally:
        fake.stop()
    print("\n".join(report(result, code)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
