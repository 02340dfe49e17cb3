"""What a valid spec will quietly do differently from what it says: warnings, not errors.

Why warn instead of reject: `replicas` outside [minReplicas, maxReplicas] is clamped, as Kubernetes' scale
subresource allows (an autoscaler or a hand edit must never make a running job invalid), but a user who
wrote `replicas: 0` should learn, before the job starts, that it will run `minReplicas` workers.
`elastic validate`, `run` and `submit` print each line and still exit 0.

`spec.worker.template` (a pod template) is for Kubernetes; a job run as local processes (`elastic run`,
`elastic submit` to an etcd's controller, docker-compose) ignores it, so those two commands say so, while
`elastic validate`, which also checks manifests meant for `kubectl apply`, does not.
"""

from __future__ import annotations

from elastic.policy.bounds import clamp_replicas
from elastic.spec import ElasticJob


def spec_warnings(job: ElasticJob, local: bool = False) -> list[str]:
    """One line per questionable value of a valid job, each naming the field and what will happen instead.

    `local`: the job is about to run as local worker processes (not pods)."""
    spec = job.spec
    warnings: list[str] = []
    desired = clamp_replicas(spec.replicas, spec.min_replicas, spec.max_replicas)
    if spec.replicas is not None and desired != spec.replicas:
        side = "below minReplicas" if spec.replicas < spec.min_replicas else "above maxReplicas"
        warnings.append(
            f"spec.replicas: {spec.replicas} is {side}; the job runs {desired} worker(s) "
            f"(clamped into [{spec.min_replicas}, {spec.max_replicas}])"
        )
    if local and spec.worker.template is not None:
        warnings.append(
            "spec.worker.template: a pod template is used on Kubernetes only; local worker processes ignore it "
            "(its volumes, init containers, securityContext, env and image do not apply)"
        )
    return warnings
