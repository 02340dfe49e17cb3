"""`elastic run --resume`: a job's checkpoints carry over between runs only when asked for.

With `spec.checkpointDir` every run of the job uses the same directory. A run that finds a checkpoint of
an earlier one there is refused unless `--resume` says to continue from it: resuming by accident (a
renamed job, a stale directory) would train on from someone else's state without a word.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from elastic.cli.common import print_spec_warnings
from elastic.errors import PermanentError
from elastic.spec import ElasticJob, load_job
from elastic.spec.paths import anchored


@dataclass(frozen=True)
class Verdict:
    error: str | None = None
    warning: str | None = None


def resume_verdict(checkpoint_dir: str | None, contents: list[str] | None, resume: bool) -> Verdict:
    """Whether a run may start (pure). `contents`: the names in checkpointDir, None when it does not exist."""
    if checkpoint_dir is None:
        if resume:
            return Verdict("--resume: the job sets no spec.checkpointDir, so each run gets a fresh checkpoint "
                           "directory and there is nothing to resume; set spec.checkpointDir: DIR in the spec "
                           "(relative to the spec file) and run it again")  # fmt: skip
        return Verdict()
    if contents and not resume:
        shown = ", ".join(sorted(contents)[:3]) + (", ..." if len(contents) > 3 else "")
        return Verdict(f"spec.checkpointDir: {checkpoint_dir} holds an earlier run's checkpoint ({shown}); run with "
                       "--resume to continue from it, or empty the directory to start from scratch")  # fmt: skip
    if resume and not contents:
        return Verdict(warning=f"--resume: spec.checkpointDir {checkpoint_dir} holds no checkpoint yet; the job "
                       "starts from scratch")  # fmt: skip
    return Verdict()


def check_resume(checkpoint_dir: str | None, resume: bool) -> Verdict:
    """`resume_verdict` on the directory as it is on this machine; a path that is not a directory is an error."""
    if checkpoint_dir is None or not Path(checkpoint_dir).exists():
        return resume_verdict(checkpoint_dir, None, resume)
    if not Path(checkpoint_dir).is_dir():
        return Verdict(f"spec.checkpointDir: {checkpoint_dir} is not a directory; point it at a directory (it is "
                       "created when missing)")  # fmt: skip
    try:
        contents = [entry.name for entry in Path(checkpoint_dir).iterdir()]
    except OSError as err:
        return Verdict(f"spec.checkpointDir: {checkpoint_dir} cannot be read ({err.strerror}); fix its permissions")
    return resume_verdict(checkpoint_dir, contents, resume)


def add_resume_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--resume", action="store_true",
                        help="continue from the checkpoint an earlier run of the job left in spec.checkpointDir "
                        "(without it, a run that finds one there is refused)")  # fmt: skip


def load_to_run(path: Path, resume: bool) -> ElasticJob:
    """A spec file as it is run here (`run`, `submit`): validated, its paths absolute (relative to the file),
    its warnings printed, and refused before anything starts if it would resume without `--resume`."""
    job = anchored(load_job(path), path)  # a SpecError here means nothing was started and nothing written
    print_spec_warnings(job, path, local=True)
    verdict = check_resume(job.spec.checkpoint_dir, resume)
    if verdict.error:
        raise PermanentError(verdict.error)
    if verdict.warning:
        print(f"warning: {verdict.warning}", file=sys.stderr)
    return job
