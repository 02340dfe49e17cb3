"""`elastic status [JOB] [-o table|wide|json|yaml] [-w]`: jobs as kubectl shows objects, or one followed live.

`-o json|yaml` prints Kubernetes-shaped objects (`apiVersion`, `kind`, `metadata`, `spec`, `status`; a
`List` of them without JOB), so the same tools read a local job and an ElasticJob from the API server.
A failed job's table row is followed by its root cause: the failing worker's log path and last lines.
Runs started with stock torchrun (no spec) are listed too, from their rendezvous keys (cli/runs.py).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

import yaml

from elastic.cli.common import add_etcd_option, add_no_tty_option, connect, say
from elastic.cli.live_watch import JobFollower, make_sink
from elastic.cli.runs import RunReport, find_run, list_runs, read_run, run_object
from elastic.cli.show import age, columns, require_job, root_cause_lines
from elastic.codec import CORRUPT_STATE
from elastic.controller.inspect import JobReport, read_report
from elastic.controller.submit import list_jobs
from elastic.errors import PermanentError
from elastic.store import JobKeys
from elastic.store.outage import Outage

OUTPUTS = ("table", "wide", "json", "yaml", "name")


def register(verbs: argparse._SubParsersAction) -> None:
    status = verbs.add_parser("status", help="show jobs' status", description=__doc__.split("\n\n")[0])
    status.add_argument("job", nargs="?", help="namespace/name or name (default: every job)")
    status.add_argument("-o", "--output", choices=OUTPUTS, default="table",
                        help="table, wide (more columns), json/yaml (Kubernetes-shaped objects), or name "
                        "(namespace/name, one a line: what shell completion offers)")
    status.add_argument("-w", "--watch", action="store_true",
                        help="follow JOB until it ends: a table redrawn in place on a terminal, with the last "
                        "events (each round change and restart) under it; one line per change otherwise")
    add_no_tty_option(status)
    add_etcd_option(status)
    status.set_defaults(run=status_cmd)


def watch_cmd(args: argparse.Namespace) -> int:
    """`status -w`: the live view of one job, driven by a watch on its keys, until its status is final."""
    if not args.job:
        raise PermanentError("status -w follows one job: name it (elastic status JOB -w)")
    if args.output != "table":
        raise PermanentError(f"status -w draws a table: -o {args.output} is for one look (drop -w or -o)")
    keys = JobKeys.parse(args.job)
    with connect(args) as store:
        # A view that runs on waits for etcd (said once) rather than exiting, from its first read on.
        outage = Outage("status -w", say=say)
        if outage.call(lambda: find_run(store, keys)) is None:  # a torchrun run is followed as a job is
            outage.call(lambda: require_job(store, keys, args.etcd))
        sink = make_sink(args.no_tty)
        try:
            JobFollower(store, keys, sink, say=outage.say).follow()
        except KeyboardInterrupt:
            pass
        finally:
            sink.close()
    return 0


def status_cmd(args: argparse.Namespace) -> int:
    if args.watch:
        return watch_cmd(args)
    with connect(args) as store:
        if args.job:
            keys = JobKeys.parse(args.job)
            run = find_run(store, keys)
            runs = [run] if run else []
            jobs = [] if run else [require_job(store, keys, args.etcd)]
        else:
            jobs, runs = list_jobs(store), [read_run(store, keys) for keys in list_runs(store)]
        reports = [read_report(store, job) for job in jobs]
    if args.output == "name":
        print("".join(f"{key}\n" for key in [*(r.job.key for r in reports), *(r.key for r in runs)]), end="")
    elif args.output in ("json", "yaml"):
        objects = [*map(as_object, reports), *map(run_object, runs)]
        shown = objects[0] if args.job else {"apiVersion": "v1", "kind": "List", "items": objects}
        text = json.dumps(shown, indent=2) + "\n" if args.output == "json" else yaml.safe_dump(shown, sort_keys=False)
        print(text, end="")
    else:
        print_table(reports, runs, wide=args.output == "wide")
    return 0


def as_object(report: JobReport) -> dict[str, Any]:
    """The job as an ElasticJob object of the API server would read (status as the controller wrote it)."""
    return {**report.job.to_dict(), "status": report.status}


HEADER = ("JOB", "PHASE", "REPLICAS", "MIN", "MAX", "ROUND", "WORLD", "RESTARTS", "STEP", "AGE", "REASON")
WIDE = ("LOSS", "RUN", "LAST FAILURE")


def row(report: JobReport, wide: bool) -> tuple[str, ...]:
    spec, status = report.job.spec, report.status
    progress = status.get("progress", {})
    cells = (
        report.job.key, status.get("phase", "Pending"), status.get("replicasText", "-"), str(spec.min_replicas),
        str(spec.max_replicas), str(status.get("round", "-")), str(status.get("worldSize", "-")),
        status.get("restartsText", "-"), str(progress.get("step", "-")), age(status), status.get("reason", ""),
    )  # fmt: skip
    if not wide:
        return cells
    loss = progress.get("loss")
    last = status.get("lastFailure", {}).get("cause", "")
    return (*cells, "-" if loss is None else f"{loss:.4f}", report.job.metadata.uid or "-", last or "-")


def run_row(run: RunReport, wide: bool) -> tuple[str, ...]:
    """A torchrun run's row: what its keys say (live agents for REPLICAS; no spec, so no desired count, bounds
    or age), `-` for the rest."""
    status = run.status
    cells = (
        run.key, status["phase"], f"{len(run.state.members)}/-", "-", "-", str(status.get("round", "-")),
        str(status.get("worldSize", "-")), status.get("restartsText", "-"), "-", "-", status["reason"],
    )  # fmt: skip
    if not wide:
        return cells
    charges = run.state.budget.charges if run.state.budget else ()
    return (*cells, "-", run.state.run_id or "-", charges[-1].cause if charges else "-")


def print_table(reports: list[JobReport], runs: Sequence[RunReport] = (), wide: bool = False) -> None:
    header = HEADER + WIDE if wide else HEADER
    rows = [row(r, wide) for r in reports] + [run_row(r, wide) for r in runs]
    for line in columns(header, rows):
        print(line)
    for report in reports:  # what went wrong, where: a corrupt key, or a failed worker's own words
        status = report.status
        if status.get("reason") == CORRUPT_STATE:
            print(f"{report.job.key}: {status.get('message', '')}")
        cause = root_cause_lines(report)
        if cause:
            print(f"{report.job.key}: {status.get('phase', '?')} ({status.get('reason', '')}): "
                  f"{status.get('message', '')}")
            print("\n".join(f"  {line}" for line in cause))
