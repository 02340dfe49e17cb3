"""The `etcd-v3` backend's settings, read from torchrun's `--rdzv-endpoint`, `--rdzv-id`, `--nnodes` and
`--rdzv-conf key=value,...`. Every key is optional; a bad value names the key and what it accepts."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousParameters

from elastic.spec import defaults
from elastic.spec.names import job_name_for
from elastic.store import EtcdAuth, JobKeys

log = logging.getLogger(__name__)

# What each --rdzv-conf key means; the README's table is this one.
CONF_KEYS = {
    "lease_seconds": "member lease TTL: how long a silently dead agent counts as present "
    f"(default {defaults.LEASE_SECONDS})",
    "last_call_seconds": "wait after reaching min nodes for more joiners before sealing "
    f"(default {defaults.LAST_CALL_SECONDS:g}); not "
    "applied after a failure once every member heard from during the incident has re-joined",
    "join_timeout": "seconds an agent may wait to get into a round "
    f"(default: torchrun's timeout, {defaults.TORCHRUN_JOIN_TIMEOUT_SECONDS})",
    "max_restarts": "the JOB-level retry budget: failure-caused re-rendezvous of the whole job "
    f"(default {defaults.MAX_RESTARTS})",
    "settle_seconds": "how long a failed agent waits for the other reports of the same incident, so the "
    f"round ends on its first cause rather than on a collateral exit (default {defaults.SETTLE_SECONDS:g})",
    "spares": "hot spares without a controller: rounds seal at max nodes minus this many members, and the "
    "agents beyond wait warm, outside the round, to take a lost member's place at once (default 0; a job "
    "the controller runs sets spec.spares instead)",
    "job": "namespace/name used in the etcd key layout, each a DNS-1123 label (default: default/<rdzv-id>, "
    "made a label plus a hash of the id when it is not one)",
    "ttl_seconds": f"how long the run's keys outlive its last agent (default {defaults.RUN_TTL_SECONDS})",
    "reset": "1 to start a closed run id afresh (default 0: a closed run id is refused)",
    "ca_cert": "CA certificate file for https:// endpoints",
    "cert": "client certificate file (TLS client auth)",
    "key": "client key file (TLS client auth)",
    "user": "etcd user name (with password)",
    "password": "etcd password",
}

# Keys torch's launcher, run.py, dynamic rendezvous (c10d) and static backends read or pass on their own
# (torch hands every backend the same dict: `LocalElasticAgent` tests pass `is_host`, the launcher always
# passes `timeout`). Refusing them would make a job written for c10d fail before it starts, so each is
# accepted: either mapped onto our own key (ours wins when both are given) or ignored with a warning that
# says why. The README's second table is this one.
MAPPED_TORCH_KEYS = {
    "timeout": "join_timeout",
    "last_call_timeout": "last_call_seconds",
}
IGNORED_TORCH_KEYS = {
    "is_host": "no agent hosts a store: each round's store lives in etcd",
    "store_type": "no agent hosts a store: each round's store lives in etcd",
    "use_libuv": "no agent hosts a store: each round's store lives in etcd",
    "read_timeout": "etcd requests retry on their own; a member's liveness is its lease",
    "close_timeout": "shutdown() only takes the member out, it never waits for the others",
    "heartbeat_timeout": "a member's liveness is its etcd lease: see lease_seconds",
    "heartbeat": "a member's liveness is its etcd lease: see lease_seconds",
    "keep_alive_interval": "a member's liveness is its etcd lease: see lease_seconds",
    "keep_alive_max_attempt": "a member's liveness is its etcd lease: see lease_seconds",
    "rank": "ranks are assigned by each round; survivors keep their order",
}
TORCH_KEYS = {
    **{key: f"mapped onto {ours} unless that is given" for key, ours in MAPPED_TORCH_KEYS.items()},
    **{key: f"accepted, ignored ({why})" for key, why in IGNORED_TORCH_KEYS.items()},
}
# Kept for callers that only need the names.
TORCHRUN_KEYS = set(TORCH_KEYS)

_warned: set[str] = set()  # ignored keys already warned about in this process
_warned_lock = threading.Lock()


def ignored_keys(conf: dict[str, Any]) -> list[str]:
    """torch's keys in `conf` that this backend accepts but has no use for (sorted)."""
    return sorted(k for k in conf if k in IGNORED_TORCH_KEYS)


def warn_ignored_once(keys: list[str]) -> None:
    """One warning per key per process: torch builds a handler (and parses the conf) again on every
    restart in some harnesses, and the same line on every restart would only bury the ones that matter."""
    with _warned_lock:
        fresh = [k for k in keys if k not in _warned]
        _warned.update(fresh)
    if fresh:
        log.warning(
            "--rdzv-conf: etcd-v3 ignores %s",
            "; ".join(f"{k} ({IGNORED_TORCH_KEYS[k]})" for k in fresh),
        )


@dataclass(frozen=True)
class RendezvousConfig:
    endpoints: str
    run_id: str
    job: JobKeys
    min_nodes: int
    max_nodes: int
    lease_seconds: int = defaults.LEASE_SECONDS
    last_call_seconds: float = defaults.LAST_CALL_SECONDS
    join_timeout: float = defaults.TORCHRUN_JOIN_TIMEOUT_SECONDS
    max_restarts: int = defaults.MAX_RESTARTS
    settle_seconds: float = defaults.SETTLE_SECONDS
    spares: int = 0
    ttl_seconds: int = defaults.RUN_TTL_SECONDS
    reset: bool = False
    local_addr: str | None = None
    # --rdzv-conf keys, else ELASTIC_ETCD_* (how the controller's agents get them)
    auth: EtcdAuth = field(default_factory=EtcdAuth)

    @classmethod
    def from_parameters(cls, params: RendezvousParameters) -> RendezvousConfig:
        conf: dict[str, Any] = dict(params.config)
        unknown = sorted(set(conf) - set(CONF_KEYS) - set(TORCH_KEYS))
        if unknown:
            raise ValueError(
                f"--rdzv-conf: unknown key(s) {', '.join(unknown)}; known: {', '.join(CONF_KEYS)} "
                f"(and torch's {', '.join(TORCH_KEYS)})"
            )
        warn_ignored_once(ignored_keys(conf))
        if not params.endpoint:
            raise ValueError("--rdzv-endpoint is required for etcd-v3, e.g. 127.0.0.1:2379 or http://h1:2379,h2:2379")
        job = conf.get("job") or f"default/{job_name_for(params.run_id)}"
        auth = EtcdAuth.from_env().override(**{k: conf.get(k) for k in ("ca_cert", "cert", "key", "user", "password")})
        if conf.get("password"):
            log.warning("--rdzv-conf password: every local user can read it in `ps`; set ELASTIC_ETCD_PASSWORD instead")
        return cls(
            endpoints=params.endpoint,
            run_id=params.run_id,
            job=JobKeys.parse(str(job)),
            min_nodes=params.min_nodes,
            max_nodes=params.max_nodes,
            lease_seconds=_number(conf, "lease_seconds", int, cls.lease_seconds, minimum=1),
            last_call_seconds=_number(
                conf, "last_call_seconds", float, _number(conf, "last_call_timeout", float, cls.last_call_seconds, 0),
                minimum=0,
            ),
            join_timeout=_number(
                conf, "join_timeout", float, _number(conf, "timeout", float, cls.join_timeout, 1), minimum=1
            ),
            max_restarts=_number(conf, "max_restarts", int, cls.max_restarts, minimum=0),
            settle_seconds=_number(conf, "settle_seconds", float, cls.settle_seconds, minimum=0),
            spares=_number(conf, "spares", int, cls.spares, minimum=0),
            ttl_seconds=_number(conf, "ttl_seconds", int, cls.ttl_seconds, minimum=1),
            reset=str(conf.get("reset", "0")).lower() in ("1", "true", "yes"),
            local_addr=params.local_addr,
            auth=auth,
        )


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
