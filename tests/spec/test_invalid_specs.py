"""Each invalid ElasticJob is rejected with a line naming the field path as the user wrote it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from elastic.spec import SpecError, parse_job

VALID: dict[str, Any] = {
    "apiVersion": "elastic.dev/v1alpha1",
    "kind": "ElasticJob",
    "metadata": {"name": "train"},
    "spec": {
        "minReplicas": 1,
        "maxReplicas": 4,
        "worker": {"command": ["python", "examples/train_ddp.py"], "env": [{"name": "A", "value": "1"}]},
        "failurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [1]}}]},
    },
}

DELETE = object()


def edited(**edits: Any) -> dict[str, Any]:
    """VALID with `path=value` edits; `spec__worker__env__0__value` is spec.worker.env[0].value."""
    doc = copy.deepcopy(VALID)
    for dotted, value in edits.items():
        steps: list[str | int] = [int(step) if step.isdigit() else step for step in dotted.split("__")]
        parent: Any = doc
        for step in steps[:-1]:
            parent = parent[step]
        if value is DELETE:
            del parent[steps[-1]]
        else:
            parent[steps[-1]] = value
    return doc


CASES = [
    pytest.param(
        edited(apiVersion="kubeflow.org/v1"),
        "apiVersion: 'kubeflow.org/v1' is not 'elastic.dev/v1alpha1'; set apiVersion: elastic.dev/v1alpha1",
        id="an apiVersion of another group is rejected",
    ),
    pytest.param(
        edited(kind="PyTorchJob"),
        "kind: 'PyTorchJob' is not 'ElasticJob'; set kind: ElasticJob",
        id="a kind other than ElasticJob is rejected",
    ),
    pytest.param(
        edited(metadata__name=DELETE),
        "metadata.name: required field is missing; add 'name' to metadata",
        id="a job without a name is rejected",
    ),
    pytest.param(
        edited(metadata__name="Train_Job"),
        "metadata.name: 'Train_Job' is not a DNS-1123 label of at most 58 characters; use lowercase letters, "
        "digits and '-', starting and ending with a letter or digit, e.g. 'train-job'",
        id="an upper-case name is rejected with a corrected suggestion",
    ),
    pytest.param(
        edited(metadata__name="a" * 59),
        f"metadata.name: '{'a' * 56}... is not a DNS-1123 label of at most 58 characters; use lowercase letters, "
        f"digits and '-', starting and ending with a letter or digit, e.g. '{'a' * 58}'",
        id="a name too long for its workers' pod names is rejected",
    ),
    pytest.param(
        edited(metadata__labels={"version": 2}),
        'metadata.labels.version: 2 is not a string; quote it, e.g. "2"',
        id="a numeric label value must be quoted",
    ),
    pytest.param(
        edited(metadata__label={"a": "b"}),
        "metadata.label: unknown field; did you mean 'labels'?",
        id="a misspelt metadata key suggests labels",
    ),
    pytest.param(
        edited(spec__minReplicas=3, spec__maxReplicas=2),
        "spec.minReplicas: 3 is greater than spec.maxReplicas (2); set minReplicas <= maxReplicas",
        id="minReplicas above maxReplicas is rejected",
    ),
    pytest.param(
        edited(spec__minReplicas=0),
        "spec.minReplicas: 0 is less than 1; set it to 1 or more",
        id="minReplicas 0 is rejected",
    ),
    pytest.param(
        edited(spec__maxReplicas=DELETE),
        "spec.maxReplicas: required field is missing; add 'maxReplicas' to spec",
        id="maxReplicas is required",
    ),
    pytest.param(
        edited(spec__maxReplicas="4"),
        "spec.maxReplicas: '4' is not an integer; write a whole number without quotes, e.g. 3",
        id="a quoted maxReplicas is not coerced",
    ),
    pytest.param(
        edited(spec__replicas=True),
        "spec.replicas: True is not an integer; write a whole number without quotes, e.g. 3",
        id="a boolean replicas is not taken for 1",
    ),
    pytest.param(
        edited(spec__nprocPerNode=1.5),
        "spec.nprocPerNode: 1.5 is not an integer; write a whole number without quotes, e.g. 3",
        id="a fractional nprocPerNode is rejected",
    ),
    pytest.param(
        edited(spec__worker__comand=["python"], spec__worker__command=DELETE),
        "spec.worker.comand: unknown field; did you mean 'command'?",
        id="a typo in command suggests the right key",
    ),
    pytest.param(
        edited(spec__worker__command=[]),
        "spec.worker.command: [] is empty; give at least 1 item",
        id="an empty command is rejected",
    ),
    pytest.param(
        edited(spec__worker__command=["python", ""]),
        "spec.worker.command[1]: '' is empty; write a non-empty string or remove the entry",
        id="an empty string inside command names its index",
    ),
    pytest.param(
        edited(spec__worker__command="python train.py"),
        "spec.worker.command: 'python train.py' is not a list; write it as a list, e.g. ['python', 'train.py']",
        id="a command written as one string shows the list form",
    ),
    pytest.param(
        edited(spec__worker__env=[{"name": "A", "value": 1}]),
        'spec.worker.env[0].value: 1 is not a string; quote it, e.g. "1"',
        id="an unquoted env value names the entry",
    ),
    pytest.param(
        edited(spec__rendezvous={"endpoints": ["localhost"]}),
        "spec.rendezvous.endpoints[0]: 'localhost' is not an etcd endpoint; write 'host:port' or "
        "'http(s)://host:port', e.g. 'http://127.0.0.1:2379'",
        id="an endpoint without a port is rejected",
    ),
    pytest.param(
        edited(spec__rendezvous={"lastCallSeconds": "2s"}),
        "spec.rendezvous.lastCallSeconds: '2s' is not a number; write a number without quotes, e.g. 2.5",
        id="a duration with a unit is not a number",
    ),
    pytest.param(
        edited(spec__rendezvous={"leaseSeconds": 0}),
        "spec.rendezvous.leaseSeconds: 0 is less than 1; set it to 1 or more",
        id="a zero lease is rejected",
    ),
    pytest.param(
        edited(spec__failurePolicy__maxRestarts=-1),
        "spec.failurePolicy.maxRestarts: -1 is less than 0; set it to 0 or more",
        id="a negative restart budget is rejected",
    ),
    pytest.param(
        edited(spec__failurePolicy__rules__0__action="Retry"),
        "spec.failurePolicy.rules[0].action: 'Retry' is not one of FailJob, RestartJob, Ignore",
        id="an unknown rule action lists the allowed ones",
    ),
    pytest.param(
        edited(spec__failurePolicy__rules__0__onExitCodes=DELETE),
        "spec.failurePolicy.rules[0]: the rule matches nothing; add onExitCodes (e.g. {operator: In, "
        "values: [1]}) or onReasons (e.g. [Evicted]), or both",
        id="a rule without a condition is rejected",
    ),
    pytest.param(
        edited(spec__failurePolicy__rules__0__onExitCodes__values=[0, 1]),
        "spec.failurePolicy.rules[0].onExitCodes.values: [0, 1] contains 0, but exit code 0 is success "
        "and never classified; remove 0 from an In rule",
        id="exit code 0 in an In rule is rejected",
    ),
    pytest.param(
        edited(spec__failurePolicy__rules__0__onExitCodes__operator="in"),
        "spec.failurePolicy.rules[0].onExitCodes.operator: 'in' is not one of In, NotIn; did you mean 'In'?",
        id="a lower-case operator suggests In",
    ),
    pytest.param(
        edited(spec__failurePolicy__rules__0__onExitCodes__values=[256]),
        "spec.failurePolicy.rules[0].onExitCodes.values[0]: 256 is greater than 255; set it to 255 or less",
        id="an exit code above 255 is rejected",
    ),
    pytest.param(
        edited(spec__restartPolicy="Always"),
        "spec.restartPolicy: 'Always' is not one of Never, OnFailure, ExitCode",
        id="restartPolicy Always is not a shorthand here",
    ),
    pytest.param(
        edited(spec__successPolicy="rank0"),
        "spec.successPolicy: 'rank0' is not one of AllWorkers, Rank0; did you mean 'Rank0'?",
        id="a lower-case success policy suggests Rank0",
    ),
    pytest.param(
        edited(spec__activeDeadlineSeconds=0),
        "spec.activeDeadlineSeconds: 0 is less than 1; set it to 1 or more",
        id="a zero deadline is rejected",
    ),
    pytest.param(
        edited(spec__ttlSecondsAfterFinished=-5),
        "spec.ttlSecondsAfterFinished: -5 is less than 0; set it to 0 or more",
        id="a negative TTL is rejected",
    ),
    pytest.param(
        edited(spec__worker__env=[{"name": "A=B", "value": "1"}]),
        "spec.worker.env[0].name: 'A=B' contains '=', which ends a variable's name; use e.g. 'A_B'",
        id="an env name with '=' is rejected (execve would split it)",
    ),
    pytest.param(
        edited(spec__worker__env=[{"name": "", "value": "1"}]),
        "spec.worker.env[0].name: '' is empty; an environment variable needs a name",
        id="an empty env name is rejected",
    ),
    pytest.param(
        edited(spec__worker__env=[{"name": "A", "value": "1"}, {"name": "B"}, {"name": "A", "value": "2"}]),
        "spec.worker.env[2].name: 'A' is already set by env[0]; keep one entry per name",
        id="a duplicate env name is rejected (the last one would silently win)",
    ),
    pytest.param(
        edited(spec__worker__env__0__value="x\0y"),
        "spec.worker.env[0].value: 'x\\x00y' contains a NUL byte (\\0), which no command line or "
        "environment can carry; remove it",
        id="a NUL byte in an env value is rejected",
    ),
    pytest.param(
        edited(spec__worker__command=["python", "train.py\0"]),
        "spec.worker.command[1]: 'train.py\\x00' contains a NUL byte (\\0), which no command line or "
        "environment can carry; remove it",
        id="a NUL byte in the command is rejected",
    ),
    pytest.param(
        edited(spec__worker__args=["--lr", "\ud800"]),
        "spec.worker.args[1]: '\\ud800' contains a lone UTF-16 surrogate, which has no UTF-8 bytes; remove it",
        id="a lone surrogate in an argument is rejected",
    ),
    pytest.param(
        edited(spec__worker__args=["x" * 40_000]),
        "spec.worker.args[0]: '" + "x" * 56 + "... is 40000 bytes long, more "
        "than the 32768 one argument or variable may have; pass large data in a file",
        id="an argument longer than Linux takes is rejected",
    ),
    pytest.param(
        edited(spec__worker__workingDir=""),
        "spec.worker.workingDir: '' is empty; write a non-empty string or remove the entry",
        id="an empty workingDir is rejected",
    ),
    pytest.param(
        edited(spec__worker__image=""),
        "spec.worker.image: '' is empty; write a non-empty string or remove the entry",
        id="an empty image is rejected",
    ),
    pytest.param(
        edited(metadata__labels={"app name": "x"}),
        "metadata.labels['app name']: 'app name' is not a valid key; the name (after any 'prefix/') must have "
        "at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit",
        id="a label key with a space is rejected as Kubernetes would",
    ),
    pytest.param(
        edited(metadata__labels={"Example.com/team": "x"}),
        "metadata.labels['Example.com/team']: 'Example.com/team' has a bad prefix before '/': it must be a "
        "lowercase DNS subdomain of at most 253 characters, e.g. 'example.com/team'",
        id="a label key with an upper-case prefix is rejected",
    ),
    pytest.param(
        edited(metadata__labels={"team": "ml research"}),
        "metadata.labels.team: 'ml research' is not a valid label value; use at most 63 letters, digits, '-', "
        "'_' and '.', starting and ending with a letter or digit (or an annotation for free text)",
        id="a label value with a space is rejected",
    ),
    pytest.param(
        edited(metadata__annotations={"x_": "free text is fine"}),
        "metadata.annotations.x_: 'x_' is not a valid key; the name (after any 'prefix/') must have at most "
        "63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit",
        id="an annotation key follows the label key rule",
    ),
    pytest.param(
        edited(spec__checkpointDir="ckpt", spec__worker__env=[{"name": "ELASTIC_CHECKPOINT_DIR", "value": "/x"}]),
        "spec.checkpointDir: 'ckpt' while spec.worker.env sets ELASTIC_CHECKPOINT_DIR too; keep checkpointDir and "
        "drop that env entry",
        id="checkpointDir and the variable it sets in env are one too many",
    ),
    pytest.param(
        edited(spec__checkpointDir=""),
        "spec.checkpointDir: '' is empty; write a non-empty string or remove the entry",
        id="an empty checkpointDir is refused",
    ),
    pytest.param(
        edited(spec=["maxReplicas", 2]),
        "spec: ['maxReplicas', 2] is not a mapping; write 'key: value' pairs under spec",
        id="a spec written as a list is rejected",
    ),
]


@pytest.mark.parametrize(("document", "expected"), CASES)
def test_invalid_spec_names_the_field(document: dict[str, Any], expected: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_job(document)
    assert expected in caught.value.problems
    path = expected.split(":", 1)[0]
    # The line is the only one about that field: no duplicate or raw pydantic text next to it.
    assert [line for line in caught.value.problems if line.startswith(path + ":")] == [expected]
    assert not any("pydantic" in line or "Input should" in line for line in caught.value.problems)


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 12


def test_every_problem_is_reported_at_once() -> None:
    document = edited(spec__maxReplicas="4", spec__restartPolicy="Always", spec__worker__comand=["x"])
    with pytest.raises(SpecError) as caught:
        parse_job(document)
    assert [line.split(":", 1)[0] for line in caught.value.problems] == [
        "spec.maxReplicas",
        "spec.worker.comand",
        "spec.restartPolicy",
    ]
    assert str(caught.value).splitlines()[0] == "3 problems in the ElasticJob"
