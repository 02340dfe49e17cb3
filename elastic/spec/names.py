"""The one rule for job names and namespaces: a DNS-1123 label, as Kubernetes requires of both.

`metadata.name`/`metadata.namespace` in a spec, `ns/name` on the command line and the etcd key layout all
use it, so a name accepted in one place is accepted everywhere, and a name cannot carry a '/', a '..',
a space or a control character into an etcd key.
"""

from __future__ import annotations

import hashlib
import re

from elastic.errors import PermanentError
from elastic.spec.excerpt import show

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_LABEL_MAX = 63
JOB_NAME_MAX = DNS1123_LABEL_MAX - len("-0000")  # 58: see job_name_problem
DEFAULT_NAMESPACE = "default"
_JOB_FORMS = "expected 'namespace/name' or 'name'"


class JobNameError(PermanentError, ValueError):
    """A job name or namespace breaks the DNS-1123 rule (a ValueError too: callers that parsed names
    before this rule existed caught ValueError)."""


def to_label(text: str) -> str:
    """The closest DNS-1123 label to `text` ('' when nothing of it survives), for suggestions and for
    deriving a name from a free-form run id."""
    return re.sub(r"[^a-z0-9-]+", "-", text[: 4 * DNS1123_LABEL_MAX].lower()).strip("-")[:DNS1123_LABEL_MAX].strip("-")


def label_problem(value: str, limit: int = DNS1123_LABEL_MAX) -> str | None:
    """None for a valid label of at most `limit` characters, else what is wrong and a suggestion, in one line."""
    if len(value) <= limit and DNS1123_LABEL.fullmatch(value):
        return None
    return (
        f"{show(value)} is not a DNS-1123 label of at most {limit} characters; use lowercase letters, digits "
        f"and '-', starting and ending with a letter or digit, e.g. {to_label(value)[:limit].strip('-') or 'my-job'!r}"
    )


def job_name_problem(value: str) -> str | None:
    """A spec's `metadata.name`: a label short enough that every name derived from it is one too.

    Each worker is named `<job>-<4 hex digits>`, and on Kubernetes that is its pod's name and the value of
    its `elastic.dev/worker` label, which may not pass 63 characters (the API server answers 422).
    """
    return label_problem(value, JOB_NAME_MAX)


def split_job_name(job: str) -> tuple[str, str]:
    """`ns/name` or a bare `name` (namespace `default`) -> (namespace, name); JobNameError otherwise."""
    namespace, slash, name = job.partition("/")
    if "/" in name:
        raise JobNameError(f"job {show(job)}: more than one '/'; {_JOB_FORMS}")
    if not slash:
        namespace, name = DEFAULT_NAMESPACE, job
    for what, part in (("namespace", namespace), ("name", name)):
        if not part:
            raise JobNameError(f"job {show(job)}: the {what} is empty; {_JOB_FORMS}")
        problem = label_problem(part)
        if problem:
            raise JobNameError(f"job {show(job)}: the {what} {problem}")
    return namespace, name


def job_name_for(run_id: str) -> str:
    """The job name of a run when `--rdzv-conf job=` is not given: the run id itself when it is a DNS-1123
    label, else its closest label plus a hash of the whole id (`--rdzv-id` may contain anything, and two
    different ids, such as `Run_A` and `run-a`, must never share a job's keys)."""
    if label_problem(run_id) is None:
        return run_id
    digest = hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    stem = to_label(run_id)[: DNS1123_LABEL_MAX - len(digest) - 1].rstrip("-")
    return f"{stem}-{digest}" if stem else f"run-{digest}"
