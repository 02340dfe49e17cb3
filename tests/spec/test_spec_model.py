"""A valid ElasticJob parses into the values the user wrote, with documented defaults, and round-trips."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from elastic.errors import PermanentError
from elastic.spec import (
    ElasticJob,
    ExitCodeOperator,
    RestartPolicy,
    RuleAction,
    SpecError,
    SuccessPolicy,
    load_job,
    parse_job,
)

REPO = Path(__file__).resolve().parents[2]

FULL = """\
apiVersion: elastic.dev/v1alpha1
kind: ElasticJob
metadata:
  name: resnet
  namespace: vision
  labels: {team: ml}
  uid: 6b1f0c2e
spec:
  minReplicas: 2
  maxReplicas: 8
  replicas: 4
  nprocPerNode: 2
  worker:
    command: [python, examples/train_ddp.py]
    args: [--epochs, "3"]
    env:
      - {name: NCCL_DEBUG, value: INFO}
    workingDir: /workspace
    image: ghcr.io/example/train:1
    resources: {limits: {cpu: "2", memory: 4Gi}}
  rendezvous:
    leaseSeconds: 5
    lastCallSeconds: 1.5
    joinTimeoutSeconds: 120
    endpoints: ["http://etcd-0:2379", "etcd-1:2379"]
  failurePolicy:
    maxRestarts: 5
    rules:
      - action: FailJob
        onExitCodes: {operator: In, values: [1, 2]}
      - action: Ignore
        onReasons: [Preempted]
      - action: RestartJob
        onExitCodes: {operator: NotIn, values: [3]}
        onReasons: [OOMKilled]
  restartPolicy: ExitCode
  successPolicy: Rank0
  activeDeadlineSeconds: 3600
  ttlSecondsAfterFinished: 0
status:
  phase: Running
"""

MINIMAL = {
    "apiVersion": "elastic.dev/v1alpha1",
    "kind": "ElasticJob",
    "metadata": {"name": "tiny"},
    "spec": {"maxReplicas": 2, "worker": {"command": ["python", "train.py"]}},
}


def test_full_example_keeps_every_value() -> None:
    job = parse_job(FULL)
    spec = job.spec
    assert job.key == "vision/resnet"
    assert job.metadata.labels == {"team": "ml"}
    assert job.metadata.uid == "6b1f0c2e"
    assert (spec.min_replicas, spec.max_replicas, spec.replicas, spec.nproc_per_node) == (2, 8, 4, 2)
    assert spec.worker.command == ["python", "examples/train_ddp.py"]
    assert spec.worker.args == ["--epochs", "3"]
    assert [(env.name, env.value) for env in spec.worker.env] == [("NCCL_DEBUG", "INFO")]
    assert spec.worker.working_dir == "/workspace"
    assert spec.worker.image == "ghcr.io/example/train:1"
    assert spec.worker.resources == {"limits": {"cpu": "2", "memory": "4Gi"}}
    assert (spec.rendezvous.lease_seconds, spec.rendezvous.last_call_seconds) == (5, 1.5)
    assert spec.rendezvous.join_timeout_seconds == 120
    assert spec.rendezvous.endpoints == ["http://etcd-0:2379", "etcd-1:2379"]
    assert spec.failure_policy.max_restarts == 5
    first, second, third = spec.failure_policy.rules
    assert first.action is RuleAction.FAIL_JOB
    assert first.on_exit_codes is not None and first.on_exit_codes.operator is ExitCodeOperator.IN
    assert first.on_exit_codes.values == [1, 2]
    assert (second.action, second.on_exit_codes, second.on_reasons) == (RuleAction.IGNORE, None, ["Preempted"])
    assert third.on_reasons == ["OOMKilled"] and third.on_exit_codes is not None
    assert spec.restart_policy is RestartPolicy.EXIT_CODE
    assert spec.success_policy is SuccessPolicy.RANK0
    assert (spec.active_deadline_seconds, spec.ttl_seconds_after_finished) == (3600, 0)


def test_minimal_job_gets_the_documented_defaults() -> None:
    job = parse_job(MINIMAL)
    spec = job.spec
    assert job.key == "default/tiny"
    assert job.metadata.labels == {} and job.metadata.uid is None
    assert (spec.min_replicas, spec.replicas, spec.nproc_per_node) == (1, None, 1)
    assert spec.worker.args == [] and spec.worker.env == []
    assert (spec.worker.working_dir, spec.worker.image, spec.worker.resources) == (None, None, None)
    rdzv = spec.rendezvous
    assert (rdzv.lease_seconds, rdzv.last_call_seconds, rdzv.join_timeout_seconds, rdzv.endpoints) == (
        10,
        2.0,
        600,
        [],
    )
    assert (spec.failure_policy.max_restarts, spec.failure_policy.rules) == (3, [])
    assert spec.restart_policy is RestartPolicy.ON_FAILURE
    assert spec.success_policy is SuccessPolicy.ALL_WORKERS
    assert (spec.active_deadline_seconds, spec.ttl_seconds_after_finished) == (None, None)


def test_replicas_outside_the_bounds_is_not_a_validation_error() -> None:
    job = parse_job({**MINIMAL, "spec": {**MINIMAL["spec"], "replicas": 99}})
    assert job.spec.replicas == 99  # clamped by elastic.policy.bounds, not rejected


def test_status_is_ignored_on_input() -> None:
    job = parse_job({**MINIMAL, "status": {"phase": "Failed", "anything": [1, 2]}})
    assert "status" not in job.to_dict()


def test_to_dict_is_camel_case_without_nulls() -> None:
    data = parse_job(MINIMAL).to_dict()
    assert data["spec"]["maxReplicas"] == 2
    assert data["spec"]["restartPolicy"] == "OnFailure"
    assert data["spec"]["rendezvous"] == {
        "leaseSeconds": 10,
        "lastCallSeconds": 2.0,
        "joinTimeoutSeconds": 600,
        "endpoints": [],
    }
    assert "replicas" not in data["spec"] and "uid" not in data["metadata"]
    json.dumps(data)  # JSON-ready, as stored in etcd


def test_full_example_round_trips_through_json() -> None:
    job = parse_job(FULL)
    assert parse_job(json.loads(json.dumps(job.to_dict()))) == job


def test_python_field_names_are_accepted_too() -> None:
    job = ElasticJob.model_validate(
        {**MINIMAL, "spec": {"max_replicas": 3, "nproc_per_node": 2, "worker": {"command": ["x"]}}}
    )
    assert (job.spec.max_replicas, job.spec.nproc_per_node) == (3, 2)


def test_a_parsed_job_is_immutable() -> None:
    job = parse_job(MINIMAL)
    with pytest.raises(ValidationError):
        job.spec.max_replicas = 5  # type: ignore[misc]
    assert job.spec.model_copy(update={"max_replicas": 5}).max_replicas == 5


def test_spec_error_is_permanent() -> None:
    assert issubclass(SpecError, PermanentError) and issubclass(SpecError, ValueError)


def test_load_job_reads_yaml_and_json(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(FULL)
    (tmp_path / "job.json").write_text(json.dumps(MINIMAL))
    assert load_job(tmp_path / "job.yaml").key == "vision/resnet"
    assert load_job(str(tmp_path / "job.json")).key == "default/tiny"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param(
            "spec: [unclosed\n",
            "line 2, column 1: did not find expected ',' or ']' (while parsing a flow sequence); "
            "fix the YAML syntax there (indentation, a space after ':', quotes around special characters)",
            id="a YAML syntax error gives line and column",
        ),
        pytest.param(
            "- a\n- b\n",
            "the document is a list, not a mapping; an ElasticJob is a mapping with "
            "apiVersion: elastic.dev/v1alpha1, kind: ElasticJob, metadata and spec",
            id="a list document is not a job",
        ),
        pytest.param(
            "# nothing here\n",
            "the document is empty; an ElasticJob is a mapping with "
            "apiVersion: elastic.dev/v1alpha1, kind: ElasticJob, metadata and spec",
            id="an empty file is not a job",
        ),
        pytest.param(
            "kind: ElasticJob\nspec: {}\nkind: ElasticJob\n",
            "line 3, column 1: duplicate key 'kind' (first at line 1); keep only one",
            id="a duplicate key is not silently dropped",
        ),
        pytest.param(
            "kind: ElasticJob\n---\nkind: ElasticJob\n",
            "line 2, column 1: a second YAML document starts here; put one ElasticJob per file",
            id="two documents in one file are rejected",
        ),
    ],
)
def test_unreadable_documents_name_the_file(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        load_job(path)
    assert caught.value.problems == [problem]
    assert caught.value.source == str(path)
    assert str(caught.value) == f"{path}: {problem}"


def test_a_missing_file_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        load_job(tmp_path / "nope.yaml")
    assert caught.value.problems == ["cannot read the file: No such file or directory; check the path"]


def test_validation_errors_from_a_file_name_it(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(FULL.replace("maxRestarts: 5", "maxRestart: 5"))
    with pytest.raises(SpecError) as caught:
        load_job(path)
    assert str(caught.value) == f"{path}: spec.failurePolicy.maxRestart: unknown field; did you mean 'maxRestarts'?"


def test_yaml_merge_keys_are_not_duplicates() -> None:
    text = yaml.safe_dump(MINIMAL) + "x-common: &c {image: a}\n"
    # A merge key overriding a merged value is legal YAML and must not be reported as a duplicate.
    with pytest.raises(SpecError) as caught:
        parse_job(text + "x-other: {<<: *c, image: b}\n")
    assert [line.split(":")[0] for line in caught.value.problems] == ["x-common", "x-other"]


names = st.from_regex(r"[a-z]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
words = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)
env_names = st.text(st.characters(min_codepoint=32, max_codepoint=126, exclude_characters="="), min_size=1, max_size=12)


@st.composite
def jobs(draw: st.DrawFn) -> dict[str, Any]:
    low = draw(st.integers(1, 8))
    rule = {
        "action": draw(st.sampled_from([a.value for a in RuleAction])),
        "onExitCodes": {"operator": "NotIn", "values": draw(st.lists(st.integers(0, 255), min_size=1))},
    }
    return {
        "apiVersion": "elastic.dev/v1alpha1",
        "kind": "ElasticJob",
        "metadata": {"name": draw(names), "labels": draw(st.dictionaries(names, names, max_size=2))},
        "spec": {
            "minReplicas": low,
            "maxReplicas": draw(st.integers(low, 16)),
            "replicas": draw(st.none() | st.integers(0, 20)),
            "worker": {
                "command": draw(st.lists(words, min_size=1, max_size=3)),
                "env": [
                    {"name": n, "value": v} for n, v in draw(st.dictionaries(env_names, words, max_size=2)).items()
                ],
            },
            "rendezvous": {"lastCallSeconds": draw(st.floats(0, 60, allow_nan=False))},
            "failurePolicy": {"maxRestarts": draw(st.integers(0, 10)), "rules": [rule]},
            "restartPolicy": draw(st.sampled_from([p.value for p in RestartPolicy])),
            "successPolicy": draw(st.sampled_from([p.value for p in SuccessPolicy])),
            "activeDeadlineSeconds": draw(st.none() | st.integers(1, 10**6)),
        },
    }


@settings(max_examples=40, deadline=None)
@given(jobs())
def test_any_valid_job_round_trips(document: dict[str, Any]) -> None:
    job = parse_job(document)
    assert parse_job(job.to_dict()) == job
    assert parse_job(yaml.safe_dump(job.to_dict())) == job


def _example_jobs() -> list[Any]:
    found = []
    for folder in ("examples", "manifests"):
        for path in sorted((REPO / folder).rglob("*.y*ml")):
            try:
                documents = list(yaml.safe_load_all(path.read_text()))
            except yaml.YAMLError:
                continue  # not ours to judge; other tests own other files
            if any(isinstance(doc, dict) and doc.get("kind") == "ElasticJob" for doc in documents):
                found.append(pytest.param(path, id=str(path.relative_to(REPO))))
    return found or [pytest.param(None, id="no example ElasticJob yet")]


@pytest.mark.parametrize("path", _example_jobs())
def test_example_jobs_in_the_repository_are_valid(path: Path | None) -> None:
    if path is None:
        pytest.skip("no ElasticJob YAML under examples/ or manifests/ yet")
    for document in yaml.safe_load_all(path.read_text()):
        if isinstance(document, dict) and document.get("kind") == "ElasticJob":
            parse_job(document, source=str(path))
