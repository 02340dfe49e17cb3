"""Validation never accepts what the local start path then rejects.

For any worker block (command, args, env with any characters: NUL, '=', lone surrogates, control
characters), either validation refuses it within a second, naming fields of spec.worker, or the agent's
argv and environment, built by the very functions the controller and the local backend use, are taken by
`subprocess` and the kernel (the program run is /bin/true: the argv is checked, not trained on).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from elastic.cluster.base import WorkerLaunch
from elastic.cluster.local import worker_environment
from elastic.controller.launch import agent_command, agent_env
from elastic.spec import SpecError, parse_job
from elastic.store import JobKeys

QUICK = 1.0
TRUE = "/bin/true"
# Every character class that has broken a start: NUL, '=', surrogates, controls, non-ASCII, plain text.
characters = st.sampled_from(["\0", "=", "\ud800", "\udc80", "\n", "\x7f", "é", "✓", " ", "a", "Z", "_", "1"])
weird = st.one_of(
    st.sampled_from(["A=B", "=", "x\0", "\0", "\ud800", "a\udc80", "", "é", "\x7f", " ", "\n"]),
    st.text(characters, min_size=1, max_size=4),
    st.text(max_size=8),
)


def mostly(plain: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Mostly ordinary text, so that most documents are accepted and their start path gets checked."""
    return st.one_of(*[plain] * 12, weird)


texts = mostly(st.text("abcXYZ_19 ./-é✓", min_size=1, max_size=8))
names = mostly(st.text("abcXYZ_19", min_size=1, max_size=8))


@st.composite
def worker_blocks(draw: st.DrawFn) -> dict[str, Any]:
    env = draw(st.lists(st.fixed_dictionaries({"name": names}, optional={"value": texts}), max_size=4))
    return {
        "command": draw(st.lists(texts, min_size=1, max_size=3)),
        "args": draw(st.lists(texts, max_size=3)),
        "env": env,
    }


def validated(worker: dict[str, Any]) -> Any:
    document = {
        "apiVersion": "elastic.dev/v1alpha1",
        "kind": "ElasticJob",
        "metadata": {"name": "prop"},
        "spec": {"maxReplicas": 2, "worker": worker},
    }
    started = time.monotonic()
    try:
        result: Any = parse_job(document)
    except SpecError as error:
        result = error
    assert time.monotonic() - started < QUICK
    return result


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worker_blocks())
def test_an_accepted_worker_block_is_one_the_os_starts(worker: dict[str, Any]) -> None:
    result = validated(worker)
    event("accepted" if not isinstance(result, SpecError) else "refused")
    if isinstance(result, SpecError):
        assert all(line.startswith("spec.worker.") and "Traceback" not in line for line in result.problems), result
        return
    job = result
    endpoints = "http://127.0.0.1:2379"
    keys = JobKeys("default", "prop")
    argv = agent_command(job, endpoints, "run-1")
    launch = WorkerLaunch("prop-0001", argv, agent_env(job, endpoints), job.spec.worker.working_dir)
    env = worker_environment(launch, Path("/tmp/ckpt"), keys.worker_exit(launch.name), os.environ)
    # Raises ValueError (NUL, '=' in a name), UnicodeEncodeError (a surrogate) or OSError (E2BIG) if not.
    subprocess.run(argv, executable=TRUE, env=env, check=True, timeout=10)
