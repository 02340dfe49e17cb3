"""Paths in a spec file are relative to the file: the worker's directory and the checkpoint directory."""

from __future__ import annotations

import pytest

from elastic.spec import ElasticJob, parse_job
from elastic.spec.paths import anchored


def job(worker: dict, **spec: object) -> ElasticJob:
    body = {"maxReplicas": 1, "worker": {"command": ["python", "train.py"], **worker}, **spec}
    return parse_job({"apiVersion": "elastic.dev/v1alpha1", "kind": "ElasticJob", "metadata": {"name": "j"},
                      "spec": body})


@pytest.mark.parametrize(
    ("worker", "spec", "working_dir", "checkpoint_dir"),
    [
        pytest.param({}, {}, "/jobs/a", None, id="the worker starts in the spec file's directory"),
        pytest.param({"workingDir": "src"}, {}, "/jobs/a/src", None, id="a relative workingDir is under it"),
        pytest.param({"workingDir": "/data"}, {}, "/data", None, id="an absolute workingDir stays"),
        pytest.param({}, {"checkpointDir": "ckpt"}, "/jobs/a", "/jobs/a/ckpt", id="a relative checkpointDir"),
        pytest.param({}, {"checkpointDir": "../ckpt"}, "/jobs/a", "/jobs/ckpt", id="normalised"),
        pytest.param({}, {"checkpointDir": "/ckpt/j"}, "/jobs/a", "/ckpt/j", id="an absolute checkpointDir stays"),
    ],
)
def test_paths_are_relative_to_the_spec_file(worker, spec, working_dir, checkpoint_dir) -> None:
    anchored_job = anchored(job(worker, **spec), "/jobs/a/job.yaml")
    assert anchored_job.spec.worker.working_dir == working_dir
    assert anchored_job.spec.checkpoint_dir == checkpoint_dir
    assert anchored_job.spec.worker.command == ["python", "train.py"]


def test_a_relative_spec_file_is_taken_from_the_working_directory(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert anchored(job({}, checkpointDir="c"), "specs/job.yaml").spec.checkpoint_dir == str(tmp_path / "specs/c")
