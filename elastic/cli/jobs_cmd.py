"""`elastic validate | submit | scale | delete`: working with jobs in a controller's etcd."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from elastic.cli.common import add_etcd_option, connect, print_spec_warnings
from elastic.cli.resume import add_resume_option, load_to_run
from elastic.cli.show import controller_leading, warn_without_controller
from elastic.codec import CorruptValueError, decode_json_object
from elastic.controller.inspect import live_parts, wait_until_final
from elastic.controller.status import FINAL_PHASES
from elastic.controller.submit import submit_job
from elastic.errors import PermanentError
from elastic.policy.bounds import clamp_replicas
from elastic.policy.exits import WILL_FAIL_AGAIN
from elastic.policy.incident import JobEnd
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
    add_resume_option(submit)
    add_etcd_option(submit)
    submit.set_defaults(run=submit_cmd)

    scale = verbs.add_parser("scale", help="set a job's desired replicas (clamped to [min, max])")
    scale.add_argument("job", help="namespace/name or name")
    scale.add_argument("replicas", type=int)
    add_etcd_option(scale)
    scale.set_defaults(run=scale_cmd)

    delete = verbs.add_parser(
        "delete",
        help="stop a job: its workers are stopped and it ends as Failed/Deleted",
        description="Close the job; a running controller stops its workers and marks it Failed (Deleted): this "
        "waits for that (--timeout). With no controller running and nothing of the job alive, its keys are "
        "removed; with live workers and no controller, it says which controller to start.",
    )
    delete.add_argument("job", help="namespace/name or name")
    delete.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                        help="how long to wait for the controller to finish the job (default 60; 0: do not wait)")
    add_etcd_option(delete)
    delete.set_defaults(run=delete_cmd)


def validate_job(args: argparse.Namespace) -> int:
    job = load_job(args.job_file)
    print_spec_warnings(job, args.job_file)
    spec = job.spec
    print(f"{args.job_file}: valid ElasticJob {job.key} ({spec.min_replicas}..{spec.max_replicas} workers, "
          f"maxRestarts {spec.failure_policy.max_restarts})")
    named = {code for rule in spec.failure_policy.rules if rule.on_exit_codes for code in rule.on_exit_codes.values}
    permanent = [str(code) for code in sorted(WILL_FAIL_AGAIN) if code not in named]
    if permanent:
        print(f"  exit codes {', '.join(permanent)} fail the job at once (the command cannot run as written; "
              "a failurePolicy rule naming a code overrides this)")
    return 0


def submit_cmd(args: argparse.Namespace) -> int:
    job = load_to_run(args.job_file, args.resume)
    with connect(args) as store:
        job = submit_job(store, job)
        print(f"job {job.key} submitted (run {job.metadata.uid})")
        warn_without_controller(store, args.etcd, "the job starts")
    return 0


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
        warn_without_controller(store, args.etcd, "the change applies", keys)
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
        run.close(run.read(), Closed(JobEnd.DELETED.value, "deleted by the user", time.time()))
        job = f"{keys.namespace}/{keys.name}"
        leader = controller_leading(store)
        if leader is not None:
            status = wait_until_final(store, keys, args.timeout)
            if status.get("phase") in FINAL_PHASES:
                print(f"job {job} deleted: {status['phase']} ({status.get('reason')}), its workers stopped")
            elif leader.get("role") == "run":  # an `elastic run` acts on its own job only
                print(f"job {job} closed; the acting controller is an 'elastic run' ({leader['holder']}): unless "
                      f"it runs this job, an 'elastic controller' finishes it after that run ends")
            else:
                print(f"job {job} closed: the controller is stopping its workers ('elastic status {job}' shows "
                      "when it is finished)")
            return 0
        alive = live_parts(store, keys)
        if alive:
            raise PermanentError(
                f"job {job} is closed, but no controller is running to stop its {', '.join(alive)}: start "
                f"'elastic controller --etcd {args.etcd}' (it stops them and marks the job Failed), or stop them "
                f"yourself and delete again"
            )
        store.delete_prefix(keys.prefix)
    print(f"job {job} deleted (no controller was running and nothing of it was alive: its keys are removed)")
    return 0
