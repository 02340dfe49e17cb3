"""The `etcd-v3` backend's settings, read from torchrun's `--rdzv-endpoint`, `--rdzv-id`, `--nnodes` and
`--rdzv-conf key=value,...`. Every key is optional; a bad value names the key and what it accepts."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousParameters

from elastic.store import JobKeys, TlsOptions

# What each --rdzv-conf key means; the README's table is this one.
CONF_KEYS = {
    "lease_seconds": "member lease TTL: how long a silently dead agent counts as present (default 10)",
    "last_call_seconds": "wait after reaching min nodes for more joiners before sealing (default 2); not "
    "applied after a failure once every member heard from during the incident has re-joined",
    "join_timeout": "seconds an agent may wait to get into a round (default: torchrun's timeout, 900)",
    "max_restarts": "the JOB-level retry budget: failure-caused re-rendezvous of the whole job (default 3)",
    "settle_seconds": "how long a failed agent waits for the other reports of the same incident, so the "
    "round ends on its root cause rather than on a collateral exit 1 (default 1)",
    "job": "namespace/name used in the etcd key layout (default: default/<rdzv-id>)",
    "ttl_seconds": "how long the run's keys outlive its last agent (default 3600)",
    "reset": "1 to start a closed run id afresh (default 0: a closed run id is refused)",
    "ca_cert": "CA certificate file for https:// endpoints",
    "cert": "client certificate file (TLS client auth)",
    "key": "client key file (TLS client auth)",
    "user": "etcd user name (with password)",
    "password": "etcd password",
}
# torchrun adds these on its own.
TORCHRUN_KEYS = {"timeout", "rank", "last_call_timeout", "join_timeout", "read_timeout"}


@dataclass(frozen=True)
class RendezvousConfig:
    endpoints: str
    run_id: str
    job: JobKeys
    min_nodes: int
    max_nodes: int
    lease_seconds: int = 10
    last_call_seconds: float = 2.0
    join_timeout: float = 900.0
    max_restarts: int = 3
    settle_seconds: float = 1.0
    ttl_seconds: int = 3600
    reset: bool = False
    local_addr: str | None = None
    tls: TlsOptions | None = None
    user: str | None = None
    password: str | None = None

    @classmethod
    def from_parameters(cls, params: RendezvousParameters) -> RendezvousConfig:
        conf: dict[str, Any] = dict(params.config)
        unknown = sorted(set(conf) - set(CONF_KEYS) - TORCHRUN_KEYS)
        if unknown:
            raise ValueError(f"--rdzv-conf: unknown key(s) {', '.join(unknown)}; known: {', '.join(CONF_KEYS)}")
        if not params.endpoint:
            raise ValueError("--rdzv-endpoint is required for etcd-v3, e.g. 127.0.0.1:2379 or http://h1:2379,h2:2379")
        job = conf.get("job") or f"default/{job_name_for(params.run_id)}"
        tls = None
        if any(conf.get(k) for k in ("ca_cert", "cert", "key")):
            tls = TlsOptions(conf.get("ca_cert"), conf.get("cert"), conf.get("key"))
        return cls(
            endpoints=params.endpoint,
            run_id=params.run_id,
            job=JobKeys.parse(str(job)),
            min_nodes=params.min_nodes,
            max_nodes=params.max_nodes,
            lease_seconds=_number(conf, "lease_seconds", int, 10, minimum=1),
            last_call_seconds=_number(conf, "last_call_seconds", float, 2.0, minimum=0),
            join_timeout=_number(conf, "join_timeout", float, _number(conf, "timeout", float, 900.0, 1), minimum=1),
            max_restarts=_number(conf, "max_restarts", int, 3, minimum=0),
            settle_seconds=_number(conf, "settle_seconds", float, 1.0, minimum=0),
            ttl_seconds=_number(conf, "ttl_seconds", int, 3600, minimum=1),
            reset=str(conf.get("reset", "0")).lower() in ("1", "true", "yes"),
            local_addr=params.local_addr,
            tls=tls,
            user=conf.get("user"),
            password=conf.get("password"),
        )


def job_name_for(run_id: str) -> str:
    """A key-safe job name from a run id (`--rdzv-id` may contain anything)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", run_id).strip("-")
    return name or "run"


def _number(conf: dict[str, Any], key: str, kind: type, default: Any, minimum: float) -> Any:
    raw = conf.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = kind(raw)
    except (TypeError, ValueError):
        raise ValueError(f"--rdzv-conf {key}={raw!r}: expected a {kind.__name__} >= {minimum:g}") from None
    if value < minimum:
        raise ValueError(f"--rdzv-conf {key}={raw!r}: expected a {kind.__name__} >= {minimum:g}")
    return value
