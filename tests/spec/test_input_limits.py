"""Bad input has limits: a hostile or broken document is refused quickly, in one short message, and a
generated document of any shape is either a job or a list of problems that each name a field."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elastic.spec import ElasticJob, SpecError, load_job, parse_job
from elastic.spec.load import MAX_DEPTH, MAX_FILE_BYTES, MAX_VALUES
from elastic.spec.problems import MAX_SHOWN_PROBLEMS

VALID = {
    "apiVersion": "elastic.dev/v1alpha1",
    "kind": "ElasticJob",
    "metadata": {"name": "tiny"},
    "spec": {"maxReplicas": 2, "worker": {"command": ["python", "train.py"]}},
}
QUICK = 1.0  # seconds: what "answers at once" means for validate on a 2-core machine


def rejected(text: str) -> tuple[SpecError, float]:
    started = time.monotonic()
    with pytest.raises(SpecError) as caught:
        parse_job(text)
    return caught.value, time.monotonic() - started


def billion_laughs(levels: int = 9) -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels):
        previous = chr(ord("a") + level - 1)
        name = chr(ord("a") + level)
        lines.append(f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_at_once_without_expanding_it() -> None:
    error, took = rejected(billion_laughs())
    assert took < QUICK
    (problem,) = error.problems
    assert f"more than {MAX_VALUES} values" in problem and "alias *" in problem, problem


def test_an_alias_inside_its_own_anchor_is_a_cycle() -> None:
    error, _ = rejected("a: &x [1, *x]\n")
    assert "a cycle" in error.problems[0], error.problems


def test_aliases_within_the_limits_still_work() -> None:
    text = yaml.safe_dump(VALID) + "x-env: &e [{name: A, value: b}]\n"
    error, _ = rejected(text + "x-again: *e\n")
    assert [line.split(":")[0] for line in error.problems] == ["x-env", "x-again"]  # unknown fields, not limits


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 5000, 100_000])
def test_deep_nesting_is_refused_without_a_recursion_error(depth: int) -> None:
    error, took = rejected("spec: " + "[" * depth + "]" * depth + "\n")
    assert took < QUICK
    assert f"nests more than {MAX_DEPTH} levels" in error.problems[0], error.problems


def test_a_file_over_the_size_cap_is_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump(VALID) + "# " + "x" * MAX_FILE_BYTES + "\n")
    started = time.monotonic()
    with pytest.raises(SpecError) as caught:
        load_job(path)
    assert time.monotonic() - started < QUICK
    assert "larger than 1 MiB" in str(caught.value)


def test_a_file_without_an_end_is_read_only_up_to_the_cap() -> None:
    with pytest.raises(SpecError, match="larger than 1 MiB"):
        load_job("/dev/zero")


def test_a_huge_value_is_shown_as_a_short_prefix() -> None:
    document = {**VALID, "metadata": {"name": "N" * 500_000}}
    error, took = rejected(yaml.safe_dump(document, width=10**9))
    assert took < QUICK
    assert len(str(error)) < 400, str(error)[:400]
    assert "metadata.name" in str(error)


def test_thousands_of_problems_are_summarised() -> None:
    document = {**VALID, "spec": {**VALID["spec"], "worker": {"command": [1] * 3000}}}
    error, took = rejected(yaml.safe_dump(document))
    assert took < QUICK
    lines = str(error).splitlines()
    assert len(lines) == 1 + MAX_SHOWN_PROBLEMS + 1 and lines[-1].startswith("  ... and 2980 more"), lines[-1]


@pytest.mark.parametrize(
    ("field", "written", "problem"),
    [
        pytest.param("lastCallSeconds", "1:30", "'1:30' is not a number", id="1:30 is not read as 90 (base 60)"),
        pytest.param("leaseSeconds", "1_0", "'1_0' is not an integer", id="1_0 is not read as 10"),
        pytest.param("leaseSeconds", "010", "'010' is not an integer", id="010 is not read as 8 (octal)"),
        pytest.param("lastCallSeconds", ".inf", "inf is not a finite number", id=".inf is refused"),
        pytest.param("leaseSeconds", "99999999999999999999", "is greater than 2147483647",
                     id="an integer beyond int32 is refused"),
    ],
)
def test_numbers_mean_what_they_look_like(field: str, written: str, problem: str) -> None:
    text = yaml.safe_dump(VALID).replace("spec:\n", f"spec:\n  rendezvous:\n    {field}: {written}\n", 1)
    error, _ = rejected(text)
    assert any(f"spec.rendezvous.{field}" in line and problem in line for line in error.problems), error.problems


def test_a_date_is_kept_as_the_string_written() -> None:
    document = {**VALID, "metadata": {"name": "tiny", "labels": {"since": "x"}}}
    text = yaml.safe_dump(document).replace("since: x", "since: 2024-01-01")
    assert parse_job(text).metadata.labels == {"since": "2024-01-01"}


# --- properties: any document at all --------------------------------------------------------------

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
FIELDS = [
    ("metadata", "name"), ("metadata", "namespace"), ("metadata", "labels"), ("spec", "minReplicas"),
    ("spec", "maxReplicas"), ("spec", "replicas"), ("spec", "nprocPerNode"), ("spec", "worker"),
    ("spec", "rendezvous"), ("spec", "failurePolicy"), ("spec", "restartPolicy"), ("spec", "successPolicy"),
    ("spec", "activeDeadlineSeconds"), ("spec", "ttlSecondsAfterFinished"), ("spec", "bogus"), ("kind", None),
]  # fmt: skip


@st.composite
def mutated_jobs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid job with a few fields replaced by values of any shape."""
    document: dict[str, Any] = {"apiVersion": VALID["apiVersion"], "kind": VALID["kind"],
                                "metadata": dict(VALID["metadata"]), "spec": dict(VALID["spec"])}
    for section, field in draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3)):
        if field is None:
            document[section] = draw(values)
        else:
            document[section][field] = draw(values)
    return document


def _answers_quickly(document: Any) -> ElasticJob | SpecError:
    started = time.monotonic()
    try:
        result: ElasticJob | SpecError = parse_job(document)
    except SpecError as error:
        result = error
    assert time.monotonic() - started < QUICK
    return result


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_jobs())
def test_any_document_is_a_job_or_problems_that_each_name_a_field(document: dict[str, Any]) -> None:
    result = _answers_quickly(document)
    if isinstance(result, SpecError):
        assert result.problems
        for line in result.problems:
            field, _, text = line.partition(": ")
            assert field and text and "Traceback" not in line, line
            assert field.split(".")[0].split("[")[0] in {"apiVersion", "kind", "metadata", "spec", "(document)"}, line
    else:
        assert parse_job(result.to_dict()) == result


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300))
def test_any_text_is_a_job_or_one_clear_error(text: str) -> None:
    result = _answers_quickly(text)
    if isinstance(result, SpecError):
        assert result.problems and all(line and "Traceback" not in line for line in result.problems)
