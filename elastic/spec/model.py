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
from pydantic.alias_generators import to_camel, to_snake
from pydantic_core import PydanticCustomError

from elastic.spec import defaults
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
    """Shorthand for the failure rules when none matches (docs/design.md §3.5)."""

    NEVER = "Never"
    ON_FAILURE = "OnFailure"
    EXIT_CODE = "ExitCode"


class Recovery(str, Enum):
    """What a membership change does to the workers of the agents that stay (docs/design.md §3.15)."""

    RESTART = "Restart"  # torchrun's way: every worker process is restarted
    IN_PLACE = "InPlace"  # survivors keep their processes (elastic.train.Session), a dead worker is re-forked


class SuccessPolicy(str, Enum):
    """When the job counts as succeeded (docs/design.md §3.6)."""

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


# The part of a PodSpec the CRD declares: what the controller relies on. The rest is kept as written
# (preserve-unknown-fields) and checked by the API server when the pod is created, where a typo is a pod
# the server refuses, in the job's status. A full PodSpec schema would be ~10,000 lines of CRD that pins
# one Kubernetes version's fields, for errors the server reports anyway.
_CONTAINERS_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["name"],
        "properties": {"name": {"type": "string", "minLength": 1}},
        "x-kubernetes-preserve-unknown-fields": True,
    },
}
POD_SPEC_SCHEMA: dict[str, Any] = {
    "description": "Anything a PodSpec holds (tolerations, nodeSelector, affinity, volumes, initContainers, "
    "securityContext, ...). A container named 'worker' is merged with the one the controller runs.",
    "x-kubernetes-preserve-unknown-fields": True,
    "properties": {
        "restartPolicy": {"type": "string", "enum": ["Never"]},
        "containers": _CONTAINERS_SCHEMA,
        "initContainers": _CONTAINERS_SCHEMA,
    },
}
WORKER_CONTAINER = "worker"
# Labels the controller sets on every worker pod (job, worker, incarnation) and selects them by.
RESERVED_LABEL_PREFIX = "elastic.dev/"
# What the worker container's command line is: the torchrun agent around spec.worker.command.
_AGENT_OWNED = ("command", "args")


class PodTemplateMeta(_Model):
    """Labels and annotations for every worker pod (the controller adds its own `elastic.dev/` labels)."""

    labels: dict[QualifiedName, LabelValue] = Field(default_factory=dict)
    annotations: dict[QualifiedName, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _not_reserved(self) -> "PodTemplateMeta":
        for key in self.labels:
            if key.startswith(RESERVED_LABEL_PREFIX):
                raise problem(
                    f"{show(key)} is set by the controller on every worker pod (it selects them by it); "
                    f"use a label outside {RESERVED_LABEL_PREFIX}",
                    field=("labels", key),
                )
        return self


def _containers(spec: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = spec.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise problem(f"{show(value)} is not a list of containers", field=("spec", key))
    for index, container in enumerate(value):
        if not isinstance(container, dict) or not isinstance(container.get("name"), str) or not container["name"]:
            raise problem("every container needs a name", field=("spec", key, index))
    return value


class PodTemplate(_Model):
    """A PodTemplateSpec for every worker pod, as Kubeflow's and JobSet's replica templates: tolerations,
    nodeSelector, volumes (`/dev/shm`), init containers, a pod security context, a service account.

    Kubernetes only: a local or docker-compose worker is a process and ignores it. The controller starts
    from this template and overlays what it owns (see `elastic.cluster.pod_manifest.pod_manifest`): the
    `worker` container's command (the torchrun agent around spec.worker.command), its controller env,
    labels, owner reference, finalizer and `restartPolicy: Never`. It fills in defaults only where the
    template is silent (no service-account token, a restricted-compatible container security context,
    a 15 s grace period).

    Refused here because the controller could not honour them: a `restartPolicy` other than Never (the
    kubelet would restart a failed worker in place, unseen: the budget could not count the incident, the
    very bug of Kubeflow's backoffLimit this project exists to avoid), `command`/`args` on the worker
    container (the agent's command line; write spec.worker.command instead). `hostNetwork`, privileged
    containers and the like are allowed: writing them is explicit, and whether a namespace may run them is
    its Pod Security admission's decision, not the controller's.
    """

    metadata: PodTemplateMeta = Field(default_factory=PodTemplateMeta)
    spec: dict[str, Any] = Field(default_factory=dict, json_schema_extra=POD_SPEC_SCHEMA)

    @model_validator(mode="after")
    def _controller_can_run_it(self) -> "PodTemplate":
        policy = self.spec.get("restartPolicy")
        if policy is not None and policy != "Never":
            raise problem(
                f"{show(policy)} would let the kubelet restart a failed worker unseen, so its incident is never "
                "charged; remove it (worker pods are always restartPolicy Never: the controller replaces them)",
                field=("spec", "restartPolicy"),
            )
        seen: dict[str, str] = {}
        for key in ("initContainers", "containers"):
            for index, container in enumerate(_containers(self.spec, key)):
                name = container["name"]
                if name in seen:
                    raise problem(f"{show(name)} is already the name of a container in spec.{seen[name]}",
                                  field=("spec", key, index, "name"))  # fmt: skip
                seen[name] = key
                if key == "initContainers" and name == WORKER_CONTAINER:
                    raise problem(f"{show(name)} is the training container's name; name the init container "
                                  "otherwise", field=("spec", key, index, "name"))  # fmt: skip
                for owned in _AGENT_OWNED if name == WORKER_CONTAINER else ():
                    if owned in container:
                        raise problem(
                            "the worker container runs the torchrun agent around spec.worker.command; "
                            f"set spec.worker.{owned} instead",
                            field=("spec", key, index, owned),
                        )
        return self

    def worker_container(self) -> dict[str, Any]:
        """The template's `worker` container ({} if it has none)."""
        containers = self.spec.get("containers") or []
        return next((c for c in containers if c["name"] == WORKER_CONTAINER), {})


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
    template: PodTemplate | None = Field(
        default=None,
        description="Kubernetes only: a PodTemplateSpec for every worker pod (tolerations, nodeSelector, volumes, "
        "initContainers, securityContext, ...); a container named 'worker' is merged with the controller's.",
    )

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

    @model_validator(mode="after")
    def _one_source_per_field(self) -> "WorkerTemplate":
        """A field of the worker container written both here and in the template is ambiguous: refused,
        rather than one of them silently winning."""
        if self.template is None:
            return self
        containers = self.template.spec.get("containers") or []
        index = next((i for i, c in enumerate(containers) if c["name"] == WORKER_CONTAINER), None)
        if index is None:
            return self
        container, where = containers[index], ("template", "spec", "containers", index)
        for ours, theirs in (("image", "image"), ("workingDir", "workingDir"), ("resources", "resources")):
            mine = getattr(self, to_snake(ours))
            if mine is not None and theirs in container and container[theirs] != mine:
                raise problem(f"spec.worker.{ours} is set too; keep one of the two", field=(*where, theirs))
        names = {var.name for var in self.env}
        for position, var in enumerate(container.get("env") or []):
            if isinstance(var, dict) and var.get("name") in names:
                raise problem(f"{show(var['name'])} is set by spec.worker.env too; keep one of the two",
                              field=(*where, "env", position, "name"))  # fmt: skip
        return self


class RendezvousSpec(_Model):
    """Timing of the round protocol and where its etcd lives (empty endpoints: the controller's default)."""

    lease_seconds: Int32 = Field(default=defaults.LEASE_SECONDS, ge=1, description="TTL of each member's lease.")
    last_call_seconds: Float = Field(
        default=defaults.LAST_CALL_SECONDS,
        ge=0,
        description="Seal a round above minReplicas after this long without a joiner.",
    )
    join_timeout_seconds: Int32 = Field(default=defaults.JOIN_TIMEOUT_SECONDS, ge=1)
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
    """The job-level retry budget and the rules that decide which exits spend it (docs/design.md §3.2-3.5)."""

    max_restarts: Int32 = Field(
        default=defaults.MAX_RESTARTS, ge=0, description="Failure-caused round transitions the job may take."
    )
    rules: list[Rule] = Field(default_factory=list, max_length=MAX_RULE_ITEMS)


# Where a worker finds its checkpoints (what spec.checkpointDir sets; examples/train_ddp.py reads it).
CHECKPOINT_DIR_ENV = "ELASTIC_CHECKPOINT_DIR"


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
    spares: Int32 = Field(
        default=0,
        ge=0,
        description="Hot spares: this many workers beyond the desired replicas run warm (agent started, torch "
        "imported; in place, the zygote ready), wait outside the round, never trigger one, and the round a lost "
        "member ends takes one in at once; the controller starts a new spare in the background.",
    )
    worker: WorkerTemplate
    rendezvous: RendezvousSpec = Field(default_factory=RendezvousSpec)
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy)
    restart_policy: RestartPolicy = RestartPolicy.ON_FAILURE
    recovery: Recovery = Field(
        default=Recovery.RESTART,
        description="InPlace: survivors keep their processes across a membership change and a dead worker is "
        "replaced by a fork of a warm process; the script uses elastic.train.Session (a script that does not "
        "is restarted whole, as with Restart). The worker command must run Python.",
    )
    success_policy: SuccessPolicy = SuccessPolicy.ALL_WORKERS
    active_deadline_seconds: Int32 | None = Field(default=None, ge=1)
    startup_timeout_seconds: Int32 = Field(
        default=defaults.STARTUP_TIMEOUT_SECONDS,
        ge=1,
        description="Before the job's first round sealed, while fewer than minReplicas workers are ready, a "
        "worker pod still Pending (unschedulable, pulling or failing to pull its image, init containers) this long "
        "after its creation fails the job with reason StartupTimeout.",
    )
    capacity_timeout_seconds: Int32 = Field(
        default=defaults.CAPACITY_TIMEOUT_SECONDS,
        ge=0,
        description="After the job trained, fewer than minReplicas ready workers (capacity reclaimed, preempted, "
        "unschedulable, a full machine) is a free wait (condition WaitingForCapacity); this long after it began "
        "the job fails with reason CapacityTimeout. 0 waits forever.",
    )
    ttl_seconds_after_finished: Int32 | None = Field(default=None, ge=0)
    pod_disruption_budget: bool = Field(
        default=False,
        description="Kubernetes: a PodDisruptionBudget keeping minReplicas of the job's worker pods ready through "
        "a drain or any other eviction (an eviction that would go below is refused until the job has more). "
        "Off by default: an eviction is free for the job anyway (docs/design.md 3.17). Ignored locally.",
    )
    checkpoint_dir: NonEmptyProcessText | None = Field(
        default=None,
        description="The job's checkpoint directory, the same for every run of the job (workers get it as "
        "ELASTIC_CHECKPOINT_DIR); relative to the spec file. Unset: each run gets a fresh directory of its own.",
    )

    @model_validator(mode="after")
    def _one_checkpoint_dir(self) -> "ElasticJobSpec":
        """checkpointDir is what sets ELASTIC_CHECKPOINT_DIR: the same variable in env too is ambiguous."""
        if self.checkpoint_dir is not None and any(var.name == CHECKPOINT_DIR_ENV for var in self.worker.env):
            raise problem(f"{show(self.checkpoint_dir)} while spec.worker.env sets {CHECKPOINT_DIR_ENV} too; keep "
                          f"checkpointDir and drop that env entry", field="checkpointDir")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _in_place_runs_python(self) -> "ElasticJobSpec":
        """In-place workers are forks of a Python process: a command that is not Python cannot be one."""
        program = self.worker.command[0].rsplit("/", 1)[-1]
        if self.recovery is Recovery.IN_PLACE and not re.fullmatch(r"python[0-9.]*", program):
            raise problem(f"InPlace needs spec.worker.command to run Python (python script.py or python -m "
                          f"module), not {show(self.worker.command[0])}; use recovery: Restart for other "
                          "programs", field="recovery")  # fmt: skip
        return self

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
