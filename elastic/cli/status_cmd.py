"""`elastic status [JOB] [-o table|wide|json|yaml] [-w]`: jobs as kubectl shows objects, or one followed live.

`-o json|yaml` prints Kubernetes-shaped objects (`apiVersion`, `kind`, `metadata`, `spec`, `status`; a
`List` of them without JOB), so the same tools read a local job and an ElasticJob from the API server.
A failed job's table row is followed by its root cause: the failing worker's log path and last lines.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import yaml

from elastic.cli.common import add_etcd_option, add_no_tty_option, connect
from elastic.cli.live_watch import JobFollower, make_sink
from elastic.cli.show import age, columns, require_job, root_cause_lines
from elastic.codec import CORRUPT_STATE
from elastic.controller.inspect import JobReport, read_report
from elastic.controller.submit import list_jobs
from elastic.errors import PermanentError
from elastic.store import JobKeys

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
        require_job(store, keys, args.etcd)
        sink = make_sink(args.no_tty)
        try:
            JobFollower(store, keys, sink).follow()
        except KeyboardInterrupt:
            pass
        finally:
            sink.close()
    return 0


def status_cmd(args: argparse.Namespace) -> int:
    if args.watch:
        return watch_cmd(args)
    with connect(args) as store:
        jobs = [require_job(store, JobKeys.parse(args.job), args.etcd)] if args.job else list_jobs(store)
        reports = [read_report(store, job) for job in jobs]
    if args.output == "name":
        print("".join(f"{r.job.key}\n" for r in reports), end="")
    elif args.output in ("json", "yaml"):
        objects = [as_object(r) for r in reports]
        shown = objects[0] if args.job else {"apiVersion": "v1", "kind": "List", "items": objects}
        text = json.dumps(shown, indent=2) + "\n" if args.output == "json" else yaml.safe_dump(shown, sort_keys=False)
        print(text, end="")
    else:
        print_table(reports, wide=args.output == "wide")
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


def print_table(reports: list[JobReport], wide: bool = False) -> None:
    header = HEADER + WIDE if wide else HEADER
    for line in columns(header, [row(r, wide) for r in reports]):
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
