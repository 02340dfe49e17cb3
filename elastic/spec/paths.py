"""Paths in a spec file are relative to the file, not to the shell's working directory (pure).

`elastic run examples/demo-crash.yaml` from the repository and `elastic run demo-crash.yaml` from
`examples/` must run the same program with the same checkpoints: the worker starts in the spec file's
directory unless `workingDir` says otherwise (a relative one is taken from the file's directory too), and a
relative `checkpointDir` is under that directory. The paths are made absolute on the machine that reads the
file (`run`, `submit`), so a controller started anywhere finds them.
"""

from __future__ import annotations

import os
from pathlib import Path

from elastic.spec.model import ElasticJob


def anchored(job: ElasticJob, spec_file: str | os.PathLike[str]) -> ElasticJob:
    """The job with its worker's working directory and its checkpoint directory as absolute paths."""
    base = Path(os.path.abspath(spec_file)).parent
    spec, worker = job.spec, job.spec.worker
    working_dir = os.path.normpath(base / worker.working_dir) if worker.working_dir else str(base)
    checkpoint_dir = os.path.normpath(base / spec.checkpoint_dir) if spec.checkpoint_dir else None
    worker = worker.model_copy(update={"working_dir": working_dir})
    return job.model_copy(update={"spec": spec.model_copy(update={"worker": worker, "checkpoint_dir": checkpoint_dir})})
