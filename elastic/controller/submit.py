"""Putting an ElasticJob into etcd (what `elastic submit` and `elastic run` do before the controller acts)."""

from __future__ import annotations

import uuid

from elastic.errors import PermanentError
from elastic.spec import ElasticJob, parse_job
from elastic.store import Delete, JobKeys, ModRevisionIs, Put, Store
from elastic.store.keys import job_keys_prefix

FINAL = ("Succeeded", "Failed")


class JobExistsError(PermanentError):
    pass


def submit_job(store: Store, job: ElasticJob, replace_finished: bool = True) -> ElasticJob:
    """Write the spec with a fresh run id (uid). A finished job of the same name is replaced; a live one
    is refused, since two specs for one job would fight."""
    keys = JobKeys(job.metadata.namespace, job.metadata.name)
    existing = store.get(keys.spec)
    if existing is not None:
        status = store.get_json(keys.status) or {}
        if status.get("phase") not in FINAL or not replace_finished:
            raise JobExistsError(
                f"job {job.key} already exists (phase {status.get('phase', 'unknown')}); "
                f"delete it first with 'elastic delete {job.key}' or use another metadata.name"
            )
        store.txn([ModRevisionIs(keys.spec, existing.mod_revision)], [Delete(keys.prefix, prefix=True)])
    with_uid = job.model_copy(update={"metadata": job.metadata.model_copy(update={"uid": str(uuid.uuid4())})})
    if not store.txn([ModRevisionIs(keys.spec, 0)], [Put.json(keys.spec, with_uid.to_dict())]).succeeded:
        raise JobExistsError(f"job {job.key} was submitted concurrently by someone else")
    return with_uid


def list_jobs(store: Store) -> list[ElasticJob]:
    entries, _ = store.get_prefix(job_keys_prefix())
    return [parse_job(e.json()) for e in entries if e.key.endswith("/spec") and e.key.count("/") == 5]
