"""The ElasticJob model and its validation: the bottom layer; it imports nothing else of the project.

One schema serves the local YAML file, the docker-compose submission and the Kubernetes CRD.
"""

from elastic.spec.load import load_job, parse_job
from elastic.spec.model import (
    API_VERSION,
    KIND,
    ElasticJob,
    ElasticJobSpec,
    EnvVar,
    ExitCodeOperator,
    ExitCodes,
    FailurePolicy,
    ObjectMeta,
    PodTemplate,
    RendezvousSpec,
    RestartPolicy,
    Rule,
    RuleAction,
    SuccessPolicy,
    WorkerTemplate,
)
from elastic.spec.problems import SpecError
from elastic.spec.schema import openapi_v3_schema

__all__ = [
    "API_VERSION",
    "KIND",
    "ElasticJob",
    "ElasticJobSpec",
    "EnvVar",
    "ExitCodeOperator",
    "ExitCodes",
    "FailurePolicy",
    "ObjectMeta",
    "PodTemplate",
    "RendezvousSpec",
    "RestartPolicy",
    "Rule",
    "RuleAction",
    "SpecError",
    "SuccessPolicy",
    "WorkerTemplate",
    "load_job",
    "openapi_v3_schema",
    "parse_job",
]
