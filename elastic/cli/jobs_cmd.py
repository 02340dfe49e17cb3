"""`elastic validate | submit | status | scale | delete`: working with jobs in a controller's etcd."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

from elastic.cli.common import add_etcd_option, connect, print_spec_warnings
from elastic.codec import CORRUPT_STATE, CorruptValueError, decode_json_object, status_for_display
from elastic.controller.submit import list_jobs, submit_job
from elastic.errors import PermanentError
from elastic.policy.bounds import clamp_replicas
from elastic.rendezvous.run import JobRun
from elastic.rendezvous.state import Closed
from elastic.spec import load_job, parse_job
from elastic.store import JobKeys, ModRevisionIs, Put


def register(verbs: argparse._SubParsersAction) -> None:
    validate = verbs.add_parser("validate", help="check an ElasticJob file; print every problem")
    validate.add_argument("job_file", metavar="JOB.yaml", type=Path)
    validate.set_defaults(run=validate_job)

    submit = verbs.add_parser("submit", help="submit an ElasticJob to a running controller's etcd")
    submit.add_argument("job_file", metavar="JOB.yaml", type=Path)
    add_etcd_option(submit)
    submit.set_defaults(run=submit_cmd)

    status = verbs.add_parser("status", help="show jobs' status")
    status.add_argument("job", nargs="?", help="namespace/name or name (default: every job)")
    status.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    add_etcd_option(status)
    status.set_defaults(run=status_cmd)

    scale = verbs.add_parser("scale", help="set a job's desired replicas (clamped to [min, max])")
    scale.add_argument("job", help="namespace/name or name")
    scale.add_argument("replicas", type=int)
    add_etcd_option(scale)
    scale.set_defaults(run=scale_cmd)

    delete = verbs.add_parser("delete", help="stop a job: its workers are stopped and it ends as Failed/Deleted")
    delete.add_argument("job", help="namespace/name or name")
    add_etcd_option(delete)
    delete.set_defaults(run=delete_cmd)


def validate_job(args: argparse.Namespace) -> int:
    job = load_job(args.job_file)
    print_spec_warnings(job, args.job_file)
    spec = job.spec
    print(f"{args.job_file}: valid ElasticJob {job.key} ({spec.min_replicas}..{spec.max_replicas} workers, "
          f"maxRestarts {spec.failure_policy.max_restarts})")
    return 0


def submit_cmd(args: argparse.Namespace) -> int:
    job = load_job(args.job_file)
    print_spec_warnings(job, args.job_file, local=True)
    with connect(args) as store:
        job = submit_job(store, job)
    print(f"job {job.key} submitted (run {job.metadata.uid})")
    return 0


def status_cmd(args: argparse.Namespace) -> int:
    with connect(args) as store:
        jobs = list_jobs(store)
        if args.job:
            wanted = JobKeys.parse(args.job)
            jobs = [j for j in jobs if (j.metadata.namespace, j.metadata.name) == (wanted.namespace, wanted.name)]
            if not jobs:
                raise PermanentError(f"no job {wanted.namespace}/{wanted.name} in etcd at {args.etcd}")
        rows = []
        for job in jobs:
            key = JobKeys(job.metadata.namespace, job.metadata.name).status
            entry = store.get(key)
            status = status_for_display(key, entry.value if entry else None)
            rows.append({"job": job.key, "spec": job.to_dict()["spec"], "status": status})
    if args.output == "json":
        print(json.dumps(rows, indent=2))
    elif args.output == "yaml":
        print(yaml.safe_dump(rows, sort_keys=False))
    else:
        _print_table(rows)
    return 0


def _print_table(rows: list[dict]) -> None:
    header = ("JOB", "PHASE", "REPLICAS", "MIN", "MAX", "ROUND", "WORLD", "RESTARTS", "STEP", "REASON")
    lines = [header]
    for row in rows:
        spec, status = row["spec"], row["status"]
        lines.append((
            row["job"], status.get("phase", "Pending"), status.get("replicasText", "-"),
            str(spec.get("minReplicas", 1)),
            str(spec["maxReplicas"]), str(status.get("round", "-")), str(status.get("worldSize", "-")),
            status.get("restartsText", "-"), str(status.get("progress", {}).get("step", "-")), status.get("reason", ""),
        ))  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
    for row in rows:  # a job whose state does not decode: say which key and how to fix it
        if row["status"].get("reason") == CORRUPT_STATE:
            print(f"{row['job']}: {row['status'].get('message', '')}")


def scale_cmd(args: argparse.Namespace) -> int:
    keys = JobKeys.parse(args.job)
    with connect(args) as store:
        for _ in range(10):
            entry = store.get(keys.spec)
            if entry is None:
                raise PermanentError(f"no job {keys.namespace}/{keys.name} in etcd at {args.etcd}")
            data = decode_json_object(keys.spec, entry.value)
            if not isinstance(data.get("spec"), dict):
                raise CorruptValueError(keys.spec, "no 'spec' mapping in the stored job")
            data["spec"]["replicas"] = args.replicas
            job = parse_job(data)
            if store.txn([ModRevisionIs(keys.spec, entry.mod_revision)], [Put.json(keys.spec, data)]).succeeded:
                break
        else:
            raise PermanentError(f"job {keys.namespace}/{keys.name} keeps changing; try again")
    spec = job.spec
    effective = clamp_replicas(args.replicas, spec.min_replicas, spec.max_replicas)
    bounds = f"{spec.min_replicas}..{spec.max_replicas}"
    note = "" if effective == args.replicas else f" (clamped to {effective}: bounds are {bounds})"
    print(f"job {job.key} scaled to {args.replicas}{note}")
    return 0


def delete_cmd(args: argparse.Namespace) -> int:
    keys = JobKeys.parse(args.job)
    with connect(args) as store:
        if store.get(keys.spec) is None:
            raise PermanentError(f"no job {keys.namespace}/{keys.name} in etcd at {args.etcd}")
        run = JobRun(store, keys)
        run.close(run.read(), Closed("Deleted", "deleted by the user", time.time()))
    print(f"job {keys.namespace}/{keys.name} deleted: the controller stops its workers", file=sys.stdout)
    return 0
