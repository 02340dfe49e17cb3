"""`elastic logs JOB [-f] [--worker W] [--tail N]`: a job's worker logs, as `kubectl logs` shows a pod's.

Local workers each write one log (the agent's output with its training processes'); etcd records where
(`logs/<worker>`), also after the worker ended. With several workers and no `--worker`, every log is shown,
each line prefixed with its worker's name. `-f` follows the logs (new workers too) until the job is final
and its workers are gone.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from elastic.cli.common import add_etcd_option, connect, say, whole_number
from elastic.cli.runs import find_run
from elastic.cli.show import require_job
from elastic.controller.inspect import JobReport, WorkerLog, read_report, tail, worker_of
from elastic.controller.status import FINAL_PHASES
from elastic.errors import PermanentError
from elastic.spec.model import INT32_MAX
from elastic.store import JobKeys, Store
from elastic.store.outage import Outage

FOLLOW_PERIOD = 0.2


def register(verbs: argparse._SubParsersAction) -> None:
    logs = verbs.add_parser("logs", help="print a job's worker logs", description=__doc__.split("\n\n")[0])
    logs.add_argument("job", help="namespace/name or name")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until the job ends")
    logs.add_argument("--worker", metavar="W", help="one worker: its name, or a member id as status shows it")
    logs.add_argument("--tail", type=whole_number(0, INT32_MAX), default=None, metavar="N",
                      help="only the last N lines of each log (default: all)")
    add_etcd_option(logs)
    logs.set_defaults(run=logs_cmd)


def logs_cmd(args: argparse.Namespace) -> int:
    keys = JobKeys.parse(args.job)
    # `-f` runs on: it waits for etcd (said once) rather than exiting, from its first read on.
    outage = Outage("logs -f", say=say)
    with connect(args) as store:
        read = lambda: _report(store, keys, args.etcd)  # noqa: E731 (read once here, and again and again with -f)
        report = outage.call(read) if args.follow else read()
        chosen = choose(report, args.worker)
        # kubectl's --prefix, when lines of several workers can meet: no --worker, and several logs or -f
        prefixed = args.worker is None and (len(chosen) > 1 or args.follow)
        offsets = {log.worker: _print_start(log, args.tail, prefixed) for log in chosen}
        if not args.follow:
            return 0
        try:
            while not _finished(report):
                time.sleep(FOLLOW_PERIOD)
                report = outage.call(read)
                for log in choose(report, args.worker, quiet=True):
                    if log.worker not in offsets:  # a worker started meanwhile: from its beginning
                        offsets[log.worker] = 0
                    offsets[log.worker] = _print_new(log, offsets[log.worker], prefixed)
        except KeyboardInterrupt:
            return 0
        for log in choose(report, args.worker, quiet=True):  # what was written while the job ended
            _print_new(log, offsets.get(log.worker, 0), prefixed)
    return 0


def _report(store: Store, keys: JobKeys, endpoints: str) -> JobReport:
    if find_run(store, keys) is not None:
        raise PermanentError(f"{keys.namespace}/{keys.name} is a run torchrun started (no ElasticJob): no worker "
                             "log is recorded; its logs are torchrun's own output, where it was started")
    return read_report(store, require_job(store, keys, endpoints))


def choose(report: JobReport, wanted: str | None, quiet: bool = False) -> list[WorkerLog]:
    """The logs to show: every worker's, or the one `wanted` names (a worker name or one of its member ids)."""
    if not report.logs:
        if quiet:
            return []
        raise PermanentError(f"job {report.job.key} has no worker logs recorded: no local worker was started "
                             "(not yet, or it runs elsewhere: on Kubernetes, kubectl logs; under docker-compose, "
                             "docker-compose logs worker)")
    if wanted is None:
        return list(report.logs)
    by_worker = {log.worker: log for log in report.logs}
    worker = worker_of(wanted, by_worker)
    if worker is None:
        raise PermanentError(f"job {report.job.key} has no worker {wanted!r}; workers: {', '.join(by_worker)}")
    return [by_worker[worker]]


def _finished(report: JobReport) -> bool:
    return report.status.get("phase") in FINAL_PHASES and report.state.closed is not None and not report.state.members


def _print_start(log: WorkerLog, lines: int | None, prefixed: bool) -> int:
    """Print a log (or its last `lines`); returns the offset to follow it from."""
    path = Path(log.path)
    try:
        size = path.stat().st_size
    except OSError as err:
        print(f"warning: worker {log.worker}: log {log.path} is not readable here ({err.strerror})", file=sys.stderr)
        return 0
    if lines is None:
        return _print_new(log, 0, prefixed)
    for line in tail(path, lines):
        print(f"[{log.worker}] {line}" if prefixed else line)
    return size


def _print_new(log: WorkerLog, offset: int, prefixed: bool) -> int:
    """Print the complete lines written since `offset`; returns the offset after them."""
    try:
        with Path(log.path).open("rb") as file:
            file.seek(offset)
            data = file.read()
    except OSError:
        return offset
    complete = data[: data.rfind(b"\n") + 1]
    for line in complete.decode("utf-8", "replace").splitlines():
        print(f"[{log.worker}] {line}" if prefixed else line)
    sys.stdout.flush()
    return offset + len(complete)
