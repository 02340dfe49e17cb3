"""The one rule for job names and namespaces: a DNS-1123 label, as Kubernetes requires of both.

`metadata.name`/`metadata.namespace` in a spec, `ns/name` on the command line and the etcd key layout all
use it, so a name accepted in one place is accepted everywhere, and a name cannot carry a '/', a '..',
a space or a control character into an etcd key.
"""

from __future__ import annotations

import re

from elastic.errors import PermanentError
from elastic.spec.excerpt import show

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_LABEL_MAX = 63
DEFAULT_NAMESPACE = "default"
_JOB_FORMS = "expected 'namespace/name' or 'name'"


class JobNameError(PermanentError, ValueError):
    """A job name or namespace breaks the DNS-1123 rule (a ValueError too: callers that parsed names
    before this rule existed caught ValueError)."""


def to_label(text: str) -> str:
    """The closest DNS-1123 label to `text` ('' when nothing of it survives), for suggestions and for
    deriving a name from a free-form run id."""
    return re.sub(r"[^a-z0-9-]+", "-", text[: 4 * DNS1123_LABEL_MAX].lower()).strip("-")[:DNS1123_LABEL_MAX].strip("-")


def label_problem(value: str) -> str | None:
    """None for a valid label, else what is wrong and a corrected suggestion, in one line."""
    if len(value) <= DNS1123_LABEL_MAX and DNS1123_LABEL.fullmatch(value):
        return None
    return (
        f"{show(value)} is not a DNS-1123 label; use at most {DNS1123_LABEL_MAX} lowercase letters, digits "
        f"and '-', starting and ending with a letter or digit, e.g. {to_label(value) or 'my-job'!r}"
    )


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
