"""How a worker is started: the `elastic agent` command and environment for one ElasticJob (pure)."""

from __future__ import annotations

import sys

from elastic.spec import ElasticJob
from elastic.spec.model import CHECKPOINT_DIR_ENV, Recovery
from elastic.store import EtcdAuth, JobKeys

# A worker's own command may say `python`: locally that must be this interpreter (the project's venv).
PYTHON_NAMES = {"python", "python3"}


def agent_command(job: ElasticJob, endpoints: str, run_id: str, python: str = sys.executable) -> list[str]:
    spec = job.spec
    rdzv = spec.rendezvous
    conf = {
        "job": job.key,
        "max_restarts": spec.failure_policy.max_restarts,
        "lease_seconds": rdzv.lease_seconds,
        "last_call_seconds": rdzv.last_call_seconds,
        "join_timeout": rdzv.join_timeout_seconds,
    }
    program = [python if part in PYTHON_NAMES else part for part in spec.worker.command[:1]]
    program += spec.worker.command[1:] + spec.worker.args
    recovery = ["--recovery=in-place"] if spec.recovery is Recovery.IN_PLACE else []
    return [
        python,
        "-m",
        "elastic.agent",
        *recovery,
        f"--rdzv-endpoint={endpoints}",
        f"--rdzv-id={run_id}",
        f"--nnodes={spec.min_replicas}:{spec.max_replicas}",
        f"--nproc-per-node={spec.nproc_per_node}",
        "--monitor-interval=0.2",
        "--local-addr=127.0.0.1",
        "--rdzv-conf=" + ",".join(f"{k}={v}" for k, v in conf.items()),
        "--no-python",
        *program,
    ]


def agent_env(job: ElasticJob, endpoints: str, auth: EtcdAuth | None = None) -> dict[str, str]:
    """The agent's environment; the controller's etcd TLS/auth settings go here, never on the command line
    (every local user can read a command line in `ps`). The agent and its workers read them back."""
    keys = JobKeys(job.metadata.namespace, job.metadata.name)
    env = {var.name: var.value for var in job.spec.worker.env}
    if job.spec.checkpoint_dir is not None:  # the job's own directory, across runs (else one per run)
        env[CHECKPOINT_DIR_ENV] = job.spec.checkpoint_dir
    env.update(
        {
            **(auth or EtcdAuth()).env(),
            "ELASTIC_ETCD_ENDPOINTS": endpoints,
            "ELASTIC_PROGRESS_KEY": keys.progress,
            "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
        }
    )
    return env
