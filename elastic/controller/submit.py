"""Putting an ElasticJob into etcd (what `elastic submit` and `elastic run` do before the controller acts)."""

from __future__ import annotations

import logging
import uuid

from elastic.codec import CorruptValueError, decode_spec, decode_status
from elastic.errors import PermanentError
from elastic.spec import ElasticJob
from elastic.store import Delete, JobKeys, ModRevisionIs, Put, Store
from elastic.store.keys import job_keys_prefix

FINAL = ("Succeeded", "Failed")
log = logging.getLogger(__name__)


class JobExistsError(PermanentError):
    pass


def submit_job(store: Store, job: ElasticJob, replace_finished: bool = True) -> ElasticJob:
    """Write the spec with a fresh run id (uid). A finished job of the same name is replaced; a live one
    is refused, since two specs for one job would fight."""
    keys = JobKeys(job.metadata.namespace, job.metadata.name)
    existing = store.get(keys.spec)
    if existing is not None:
        try:
            status = decode_status(keys.status, store.get(keys.status).value) if store.get(keys.status) else {}
        except CorruptValueError:
            status = {}
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
    """Every submitted job whose spec decodes; a bad spec is logged and skipped, never fatal to the rest
    (its job's controller, if one runs, marks it CorruptState)."""
    entries, _ = store.get_prefix(job_keys_prefix())
    jobs = []
    for entry in entries:
        if entry.key.endswith("/spec") and entry.key.count("/") == 5:
            try:
                jobs.append(decode_spec(entry.key, entry.value))
            except CorruptValueError as err:
                log.warning("%s", err)
    return jobs
