"""`elastic run JOB.yaml` (the main job on this machine) and `elastic controller` (the controller alone)."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elastic.cli import local_etcd
from elastic.cli.common import (
    StatusPrinter,
    add_etcd_option,
    add_no_tty_option,
    add_process_cap_option,
    connect,
    format_status_line,
    process_cap,
    say,
    whole_number,
)
from elastic.cli.live_watch import Following
from elastic.cli.output import OUTPUT_CLOSED_EXIT, discard_stdout
from elastic.cli.resume import add_resume_option, load_to_run
from elastic.cli.show import root_cause_lines
from elastic.controller.inspect import read_report
from elastic.controller.machinery.etcd_election import Election
from elastic.controller.reconcile import capacity_problem
from elastic.controller.submit import JobExistsError, submit_job
from elastic.errors import PermanentError
from elastic.rendezvous.run import JobRun
from elastic.rendezvous.state import Closed
from elastic.spec import ElasticJob, load_job
from elastic.store import JobKeys, Store

if TYPE_CHECKING:
    from elastic.controller.metrics_export import ControllerMetrics


def register(verbs: argparse._SubParsersAction) -> None:
    run = verbs.add_parser(
        "run",
        help="run an ElasticJob on this machine (local etcd + controller + worker processes)",
        description="Validate JOB.yaml, use this machine's local etcd unless --etcd is given (started if none "
        "runs, it keeps the job's keys after the run for 'elastic status|describe|logs'), submit the job, run the "
        "controller in this process with local worker processes, show progress (live on a terminal), and exit 0 "
        "on Succeeded. Paths in JOB.yaml (the worker's workingDir, which defaults to the file's directory, and "
        "spec.checkpointDir) are relative to the file, so it runs the same from any directory. Each run starts "
        "from scratch unless the job sets spec.checkpointDir and --resume is given.",
    )
    run.add_argument("job_file", metavar="JOB.yaml", type=Path)
    add_etcd_option(run, starts_one=True)
    run.add_argument("--log-dir", type=Path, default=None, help="where worker logs go (default: a temp dir)")
    add_process_cap_option(run)
    add_metrics_option(run)
    add_no_tty_option(run)
    add_resume_option(run)
    run.set_defaults(run=run_job)

    controller = verbs.add_parser(
        "controller",
        help="run the controller alone against an etcd (every submitted job)",
        description="Reconcile every ElasticJob: those submitted to etcd, with local worker processes "
        "(--backend local) or with agents the platform starts (--backend external: compose's workers, a batch "
        "system's; never started or stopped here), or those of the Kubernetes API, with pods and leader election "
        "(--backend kubernetes).",
    )
    add_etcd_option(controller)
    controller.add_argument("--backend", choices=["local", "external", "kubernetes"], default="local")
    controller.add_argument(
        "--submit", type=Path, action="append", default=[], metavar="JOB.yaml",
        help="submit this job as the controller starts (repeatable; local and external backends), unless a job of "
        "its name is in etcd already: a restarted controller carries on with the job it ran, finished or not. "
        "Under --backend external the agents join with --rdzv-id=<metadata.name> --rdzv-conf "
        "job=<namespace>/<name>",
    )  # fmt: skip
    controller.add_argument("--log-dir", type=Path, default=Path(".elastic/logs"))
    controller.add_argument(
        "--health-port", type=whole_number(1, 65535), default=None, metavar="PORT",
        help="serve GET /healthz and /readyz on this port (the kubelet's probes; --backend kubernetes)",
    )  # fmt: skip
    add_process_cap_option(controller)
    add_metrics_option(controller)
    controller.set_defaults(run=run_controller)


def add_metrics_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port", type=whole_number(1, 65535), default=None, metavar="PORT",
        help="serve Prometheus metrics at GET /metrics on this port (README: Metrics)",
    )  # fmt: skip


def serve_metrics(args: argparse.Namespace) -> ControllerMetrics | None:
    """The process's metrics, served before anything starts, so that a port in use fails at once."""
    if args.metrics_port is None:
        return None
    from elastic.controller.metrics_export import ControllerMetrics  # prometheus_client: only when served

    metrics = ControllerMetrics()
    try:
        metrics.serve(args.metrics_port)
    except OSError as err:
        raise PermanentError(f"--metrics-port {args.metrics_port}: {err.strerror or err}") from err
    print(f"metrics at http://127.0.0.1:{args.metrics_port}/metrics", flush=True)
    return metrics


def run_job(args: argparse.Namespace) -> int:
    job = load_to_run(args.job_file, args.resume)
    spec, cap = job.spec, process_cap(args)
    too_many = capacity_problem(job, spec.min_replicas, cap)  # a job that fits smaller runs at what fits
    if too_many:  # known before etcd starts: nothing is started or written
        raise PermanentError(too_many)
    metrics = serve_metrics(args)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix=f"elastic-{job.metadata.name}-"))
    with _signals_stop_this_command():
        return _run_job(args, job, cap, metrics, log_dir)


def _run_job(
    args: argparse.Namespace, job: ElasticJob, cap: int, metrics: ControllerMetrics | None, log_dir: Path
) -> int:
    from elastic.controller.manager import LocalJobRunner  # here: the verbs that only read need none of it

    if args.etcd is None:  # the local etcd, with no TLS or auth of $ELASTIC_ETCD_* meant for another one
        endpoints = _local_etcd()
        store = Store(endpoints)
    else:
        store, endpoints = connect(args), args.etcd  # '' is an error in connect()
    keys = JobKeys(job.metadata.namespace, job.metadata.name)
    runner = view = None
    try:
        job = submit_job(store, job)
        print(f"job {job.key} submitted (run {job.metadata.uid}); worker logs in {log_dir}", flush=True)
        # The view follows the job's keys with a watch (every round change), beside the controller's loop.
        view = Following(store, keys, args.no_tty)
        # One acting controller per etcd: if an `elastic controller` leads, it runs the job and we follow.
        election = Election(store, role="run", on_change=lambda line: print(line, flush=True))
        runner = LocalJobRunner(store, job, endpoints, log_dir, election, cap, metrics, say=say)
        status = runner.run_until_done()
        cause = [] if status.get("phase") == "Succeeded" else root_cause_lines(read_report(store, job))
    except (KeyboardInterrupt, BrokenPipeError) as stop:
        how = _stopped_by(stop)
        print(f"interrupted ({how}): stopping the workers and finishing job {job.key}", file=sys.stderr, flush=True)
        closed = Closed(INTERRUPTED, f"elastic run was stopped ({how})", time.time())
        if runner is not None:
            status = runner.wind_down(closed)
        else:  # stopped while submitting: close what was written, so that nobody runs it
            run = JobRun(store, keys)
            run.close(run.read(), closed)
            status = {}
        if status.get("phase"):
            print(format_status_line(status), flush=True)
        return OUTPUT_CLOSED_EXIT if how == OUTPUT_CLOSED else 130
    finally:
        if runner is not None:
            runner.stop_workers()
            runner.election.resign()
        if view is not None:  # the job's end shown, the terminal handed back before the last lines
            view.close()
        store.close()
    print(format_status_line(status), flush=True)
    if status.get("phase") == "Succeeded":
        return 0
    print(f"error: job {job.key} failed: {status.get('reason')}: {status.get('message')}", file=sys.stderr)
    for line in cause:
        print(line, file=sys.stderr)
    return 1


def _local_etcd() -> str:
    """This machine's local etcd (cli/local_etcd.py), started if none runs; it outlives the run, so that
    `elastic status`, `describe` and `logs` still read the job afterwards."""
    found, server = local_etcd.start()
    if server is None:
        print(f"using the local etcd at {found.url} (data: {found.data_dir})", flush=True)
    else:
        print(f"etcd {server.version} started at {found.url} (v3 API only); it keeps running after this run, so "
              f"that 'elastic status|describe|logs' read the job (data: {found.data_dir}; 'elastic etcd stop' "
              "stops it)", flush=True)
    return found.url


def run_controller(args: argparse.Namespace) -> int:
    with _signals_stop_this_command():
        return _run_controller(args)


def _run_controller(args: argparse.Namespace) -> int:
    if args.submit and args.backend == "kubernetes":
        raise PermanentError("--submit is for the local and external backends: on Kubernetes, kubectl apply the "
                             "ElasticJob")
    jobs = [load_job(path) for path in args.submit]  # a bad spec is refused before anything is written
    store = connect(args)
    metrics = serve_metrics(args)
    if args.backend == "kubernetes":  # ElasticJobs from the API server, one leader among the replicas
        from elastic.controller.kube_manager import run_kubernetes_controller

        return run_kubernetes_controller(store, args.etcd, health_port=args.health_port, metrics=metrics)
    from elastic.controller.manager import LocalControllerManager  # here, as in _run_job

    for job in jobs:
        _submit_once(store, job)
    manager = LocalControllerManager(
        store,
        args.etcd,
        args.log_dir,
        Election(store, on_change=lambda line: print(line, flush=True)),
        process_cap(args),
        metrics,
        external_workers=args.backend == "external",
    )
    printers: dict[str, StatusPrinter] = {}

    def show(job: str, status: dict) -> None:
        printers.setdefault(job, StatusPrinter())(status, job)

    print(f"controller watching {args.etcd} (backend {args.backend})", flush=True)
    manager.run_forever(show)
    return 0


def _submit_once(store: Store, job: ElasticJob) -> None:
    """Submit `job` unless one of its name is in etcd: compose restarts a controller that died, and that one
    must carry on with the job (a finished one too), never start it over."""
    try:
        submitted = submit_job(store, job, replace_finished=False)
    except JobExistsError as err:
        print(f"not submitted: {err}", flush=True)
        return
    print(f"job {submitted.key} submitted", flush=True)


INTERRUPTED = "Interrupted"
OUTPUT_CLOSED = "stdout closed"


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is (the job is finished, the workers stopped) and named as such."""


class OutputClosed(KeyboardInterrupt):
    """stdout was closed (`elastic run JOB.yaml | head -2`): the run stops as Ctrl-C stops it, silently."""


def _stopped_by(stop: BaseException) -> str:
    if isinstance(stop, (OutputClosed, BrokenPipeError)):
        _give_up_stdout()
        return OUTPUT_CLOSED
    return "SIGTERM" if isinstance(stop, Terminated) else "Ctrl-C"


def _give_up_stdout() -> None:
    """Once, whichever way the closed pipe was heard of first (a BrokenPipeError in the main thread, or
    SIGPIPE from a write in another): no further SIGPIPE raises OutputClosed, even one already pending (it
    would end the wind-down), and the wind-down's own lines are discarded."""
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    discard_stdout()


@contextmanager
def _signals_stop_this_command() -> Iterator[None]:
    """SIGTERM and a closed stdout stop the command (see `_stop_on_signals`) while it runs; afterwards a caller
    in the same process (a test, an embedding) has its own handlers back."""
    previous = _stop_on_signals()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _stop_on_signals() -> dict[int, Any]:
    """SIGTERM ends the process like Ctrl-C, so that the job is finished and the workers stopped. So does a
    closed stdout: a write to it raises SIGPIPE, which Python ignores, in whichever thread wrote (the live
    view's, often); handled here, the main thread hears of it at once."""

    def terminate(*_: object) -> None:
        raise Terminated

    def output_closed(*_: object) -> None:
        _give_up_stdout()
        raise OutputClosed

    previous = {signal.SIGTERM: signal.getsignal(signal.SIGTERM), signal.SIGPIPE: signal.getsignal(signal.SIGPIPE)}
    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGPIPE, output_closed)
    return previous
