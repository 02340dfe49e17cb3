"""The ElasticJob model: one schema for a local YAML file, a docker-compose service and the Kubernetes CRD.

Kubernetes-shaped (apiVersion/kind/metadata/spec, camelCase keys) because that is the spelling users
already know and the one the API server stores; the same model validates all three front ends, and
`openapi_v3_schema()` derives the CRD schema from it so the two can never drift apart.

Every model forbids unknown keys: a typo such as `comand:` must be an error, not a silently ignored field.
Integers are strict (`"3"`, `3.5` and `true` are rejected) to agree with the CRD's `type: integer`.
Models are frozen: a parsed job is a value; derive a changed one with `model_copy(update=...)`.
"""

import re
from collections.abc import Callable
from enum import Enum
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    AllowInfNan,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from elastic.spec.excerpt import show
from elastic.spec.labels import label_value_problem, qualified_name_problem
from elastic.spec.names import job_name_problem, label_problem
from elastic.spec.process_text import env_name_problem, text_problem

API_VERSION = "elastic.dev/v1alpha1"
KIND = "ElasticJob"

_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]")

# Every number has an upper bound: Kubernetes stores these as int32 (replicas, seconds), etcd takes a lease
# TTL only that large, and nothing past it means anything on a real machine (a 68-year lease).
INT32_MAX = 2**31 - 1
Int32 = Annotated[int, Strict(), Field(le=INT32_MAX)]
# Strict float still takes an int such as `2`; `.inf`/`.nan` are refused because JSON (so etcd and the CRD)
# cannot carry them, and an infinite lastCallSeconds would never seal a round.
Float = Annotated[float, Strict(), AllowInfNan(False), Field(le=INT32_MAX)]
NonEmptyStr = Annotated[str, StringConstraints(min_length=1)]


def problem(text: str, field: str | tuple[str | int, ...] | None = None) -> PydanticCustomError:
    """An error whose text is already user-facing; `field` names a child key (or a path below the model,
    such as `("env", 1, "name")`) when raised by a model check.

    `problems.py` prints it as `<path>[.<field>]: <text>` instead of translating a pydantic error type.
    """
    return PydanticCustomError("elastic_spec", "{problem}", {"problem": text, "field": field})


def _checked(rule: Callable[[str], str | None]) -> AfterValidator:
    """A validator from a rule that returns a problem sentence (or None for a good value)."""

    def check(value: str) -> str:
        text = rule(value)
        if text:
            raise problem(text)
        return value

    return AfterValidator(check)


def _endpoint(value: str) -> str:
    fix = "write 'host:port' or 'http(s)://host:port', e.g. 'http://127.0.0.1:2379'"
    parts = urlsplit(value if "://" in value else f"http://{value}")
    try:
        port = parts.port
    except ValueError:
        port = None
    host = parts.netloc.rsplit(":", 1)[0] if ":" in parts.netloc else parts.netloc
    if (
        parts.scheme not in ("http", "https")
        or not _HOST.fullmatch(host)
        or not port
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        raise problem(f"{show(value)} is not an etcd endpoint; {fix}")
    return value


DNSLabel = Annotated[str, _checked(label_problem)]
JobName = Annotated[str, _checked(job_name_problem)]
Endpoint = Annotated[str, AfterValidator(_endpoint)]
# What reaches a worker process's argv, environment or working directory (see process_text.py).
ProcessText = Annotated[str, _checked(text_problem)]
NonEmptyProcessText = Annotated[str, StringConstraints(min_length=1), _checked(text_problem)]
QualifiedName = Annotated[str, _checked(qualified_name_problem)]
LabelValue = Annotated[str, _checked(label_value_problem)]


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )


class RestartPolicy(str, Enum):
    """Shorthand for the failure rules when none matches (DESIGN §3.5)."""

    NEVER = "Never"
    ON_FAILURE = "OnFailure"
    EXIT_CODE = "ExitCode"


class SuccessPolicy(str, Enum):
    """When the job counts as succeeded (DESIGN §3.6)."""

    ALL_WORKERS = "AllWorkers"
    RANK0 = "Rank0"


# Failure rules and the reasons of one rule: far more than any job needs, few enough that every CEL rule
# evaluated per rule has a small bounded cost.
MAX_RULE_ITEMS = 32


class RuleAction(str, Enum):
    """What a matching failure rule does. `elastic.policy.exits.Action` carries the same values."""

    FAIL_JOB = "FailJob"
    RESTART_JOB = "RestartJob"
    IGNORE = "Ignore"


class ExitCodeOperator(str, Enum):
    IN = "In"
    NOT_IN = "NotIn"


class ObjectMeta(_Model):
    """The part of Kubernetes' ObjectMeta that identifies a job and that users write by hand."""

    name: JobName = Field(
        description="Job name (DNS-1123 label, at most 58 characters: its workers' pod names add 5); unique "
        "within its namespace."
    )
    namespace: DNSLabel = "default"
    labels: dict[QualifiedName, LabelValue] = Field(default_factory=dict)
    annotations: dict[QualifiedName, str] = Field(default_factory=dict)
    uid: str | None = Field(default=None, description="Run id: a re-created job never joins a stale run.")


class EnvVar(_Model):
    """Kubernetes' EnvVar shape, so the worker block can be pasted into a pod template."""

    name: Annotated[str, _checked(env_name_problem)] = Field(
        json_schema_extra={"minLength": 1, "pattern": "^[ -<>-~]+$"},
        description="Printable ASCII without '=' (Kubernetes' relaxed rule; what execve can carry).",
    )
    value: ProcessText = ""


class WorkerTemplate(_Model):
    """The training program each node runs under torchrun, and where to run it."""

    command: list[NonEmptyProcessText] = Field(
        min_length=1, description='e.g. ["python", "examples/train_ddp.py"]'
    )
    args: list[ProcessText] = Field(default_factory=list)
    env: list[EnvVar] = Field(
        default_factory=list,
        description="One entry per name.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    working_dir: NonEmptyProcessText | None = Field(
        default=None, description="Must exist where the worker starts; a missing one fails the job at start."
    )
    image: NonEmptyStr | None = Field(default=None, description="Container image (compose and Kubernetes).")
    resources: dict[str, Any] | None = Field(default=None, description="Passed to pods unchanged.")

    @model_validator(mode="after")
    def _unique_env_names(self) -> "WorkerTemplate":
        first: dict[str, int] = {}
        for index, var in enumerate(self.env):
            seen = first.setdefault(var.name, index)
            if seen != index:
                raise problem(
                    f"{show(var.name)} is already set by env[{seen}]; keep one entry per name",
                    field=("env", index, "name"),
                )
        return self


class RendezvousSpec(_Model):
    """Timing of the round protocol and where its etcd lives (empty endpoints: the controller's default)."""

    lease_seconds: Int32 = Field(default=10, ge=1, description="TTL of each member's lease.")
    last_call_seconds: Float = Field(
        default=2.0, ge=0, description="Seal a round above minReplicas after this long without a joiner."
    )
    join_timeout_seconds: Int32 = Field(default=600, ge=1)
    endpoints: list[Endpoint] = Field(default_factory=list)


class ExitCodes(_Model):
    """Matches a worker's exit code (a signal death -N counts as 128+N)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.operator != 'In' || !(0 in self.values)",
                    "message": "exit code 0 is success and never classified; remove it from an In rule",
                }
            ]
        }
    )

    operator: ExitCodeOperator
    # Bounded so that the CEL rule above has a bounded cost: the API server refuses a CRD whose rules it
    # cannot bound (tests/spec/test_cel_cost.py estimates it as the server does, conservatively).
    values: list[Annotated[int, Strict(), Field(ge=0, le=255)]] = Field(min_length=1, max_length=256)

    @model_validator(mode="after")
    def _zero_is_not_a_failure(self) -> "ExitCodes":
        if self.operator is ExitCodeOperator.IN and 0 in self.values:
            raise problem(
                f"{show(self.values)} contains 0, but exit code 0 is success and never classified; "
                "remove 0 from an In rule",
                field="values",
            )
        return self


class Rule(_Model):
    """One failure rule; the first rule matching an incident's first cause picks the action."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "has(self.onExitCodes) || has(self.onReasons)", "message": "set onExitCodes or onReasons"}
            ]
        }
    )

    action: RuleAction
    on_exit_codes: ExitCodes | None = None
    on_reasons: list[NonEmptyStr] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_RULE_ITEMS,
        description="e.g. Evicted, Preempted, OOMKilled, NodeLost.",
    )

    @model_validator(mode="after")
    def _matches_something(self) -> "Rule":
        if self.on_exit_codes is None and self.on_reasons is None:
            raise problem(
                "the rule matches nothing; add onExitCodes (e.g. {operator: In, values: [1]}) "
                "or onReasons (e.g. [Evicted]), or both"
            )
        return self


class FailurePolicy(_Model):
    """The job-level retry budget and the rules that decide which exits spend it (DESIGN §3.2-3.5)."""

    max_restarts: Int32 = Field(default=3, ge=0, description="Failure-caused round transitions the job may take.")
    rules: list[Rule] = Field(default_factory=list, max_length=MAX_RULE_ITEMS)


class ElasticJobSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",
                    "message": "minReplicas must be <= maxReplicas",
                }
            ]
        }
    )

    min_replicas: Int32 = Field(default=1, ge=1)
    max_replicas: Int32 = Field(ge=1)
    replicas: Int32 | None = Field(
        default=None,
        ge=0, description="Desired nodes; unset means maxReplicas; clamped into [min, max]."
    )
    nproc_per_node: Int32 = Field(default=1, ge=1)
    worker: WorkerTemplate
    rendezvous: RendezvousSpec = Field(default_factory=RendezvousSpec)
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy)
    restart_policy: RestartPolicy = RestartPolicy.ON_FAILURE
    success_policy: SuccessPolicy = SuccessPolicy.ALL_WORKERS
    active_deadline_seconds: Int32 | None = Field(default=None, ge=1)
    ttl_seconds_after_finished: Int32 | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _bounds(self) -> "ElasticJobSpec":
        if self.min_replicas > self.max_replicas:
            raise problem(
                f"{show(self.min_replicas)} is greater than spec.maxReplicas ({show(self.max_replicas)}); "
                "set minReplicas <= maxReplicas",
                field="minReplicas",
            )
        return self


class ElasticJob(_Model):
    """An elastic training job. `status` is written by the controller and ignored on input."""

    api_version: Literal["elastic.dev/v1alpha1"]
    kind: Literal["ElasticJob"]
    metadata: ObjectMeta
    spec: ElasticJobSpec

    @model_validator(mode="before")
    @classmethod
    def _drop_status(cls, data: Any) -> Any:
        if isinstance(data, dict) and "status" in data:
            return {key: value for key, value in data.items() if key != "status"}
        return data

    @property
    def key(self) -> str:
        """`namespace/name`: the job's identity in etcd and in Kubernetes."""
        return f"{self.metadata.namespace}/{self.metadata.name}"

    def to_dict(self) -> dict[str, Any]:
        """camelCase JSON-ready dict with defaults filled in; `parse_job(job.to_dict()) == job`."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
