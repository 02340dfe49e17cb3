"""What a valid spec will quietly do differently from what it says: warnings, not errors.

Why warn instead of reject: `replicas` outside [minReplicas, maxReplicas] is clamped, as Kubernetes' scale
subresource allows (an autoscaler or a hand edit must never make a running job invalid), but a user who
wrote `replicas: 0` should learn, before the job starts, that it will run `minReplicas` workers.
`elastic validate`, `run` and `submit` print each line and still exit 0.
"""

from __future__ import annotations

from elastic.policy.bounds import clamp_replicas
from elastic.spec import ElasticJob


def spec_warnings(job: ElasticJob) -> list[str]:
    """One line per questionable value of a valid job, each naming the field and what will happen instead."""
    spec = job.spec
    warnings: list[str] = []
    desired = clamp_replicas(spec.replicas, spec.min_replicas, spec.max_replicas)
    if spec.replicas is not None and desired != spec.replicas:
        side = "below minReplicas" if spec.replicas < spec.min_replicas else "above maxReplicas"
        warnings.append(
            f"spec.replicas: {spec.replicas} is {side}; the job runs {desired} worker(s) "
            f"(clamped into [{spec.min_replicas}, {spec.max_replicas}])"
        )
    return warnings
