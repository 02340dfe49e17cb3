"""The etcd key layout (docs/design.md §4). The only module that spells a key.

Values under these keys are JSON, so `etcdctl get --prefix /elastic/` reads like a status page.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from elastic.spec.names import split_job_name

ROOT = "/elastic/"


@dataclass(frozen=True)
class JobKeys:
    """Keys of one job, identified by namespace and name (each key string is built once: the state of a
    job is parsed at every revision, for every key)."""

    namespace: str
    name: str

    @classmethod
    def parse(cls, job: str) -> JobKeys:
        """`ns/name` or a bare `name` (namespace `default`), each a DNS-1123 label as in a spec's metadata.

        Anything else raises JobNameError (a PermanentError and a ValueError): a '/', '..', space or
        control character in a key segment would address another job's keys, or none.
        """
        return cls(*split_job_name(job))

    @functools.cached_property
    def prefix(self) -> str:
        return f"{ROOT}jobs/{self.namespace}/{self.name}/"

    @functools.cached_property
    def spec(self) -> str:
        return self.prefix + "spec"

    @functools.cached_property
    def run(self) -> str:
        return self.prefix + "run"

    @functools.cached_property
    def members_prefix(self) -> str:
        return self.prefix + "members/"

    def member(self, member_id: str) -> str:
        return self.members_prefix + member_id

    @functools.cached_property
    def round(self) -> str:
        return self.prefix + "round"

    @functools.cached_property
    def roster_range(self) -> tuple[str, str]:
        """[start, end) of the keys only the sealer reads (`members/`, `membership/`): a member watches the
        job's other keys, so that what it receives per round does not grow with the job's size."""
        return self.prefix + "members", self.prefix + "membert"

    @functools.cached_property
    def member_ranges(self) -> tuple[tuple[str, str], tuple[str, str]]:
        """The job's keys but the roster's, as two [start, end) ranges: what a member watches."""
        start, end = self.roster_range
        return (self.prefix, start), (end, self.prefix[:-1] + chr(ord(self.prefix[-1]) + 1))

    @functools.cached_property
    def membership_prefix(self) -> str:
        return self.prefix + "membership/"

    def rank_bucket(self, bucket: int) -> str:
        """One bucket of the last sealed round's ranks that had members in it (the round is in the value): a
        member watches its own bucket's key, the same key in every round."""
        return f"{self.ranks_prefix}{bucket}"

    @functools.cached_property
    def ranks_prefix(self) -> str:
        return self.membership_prefix + "ranks/"

    @functools.cached_property
    def sealer(self) -> str:
        """The member that seals rounds and watches the member keys, on its member lease (docs/design.md §3.20)."""
        return self.prefix + "sealer"

    @functools.cached_property
    def budget(self) -> str:
        return self.prefix + "budget"

    @functools.cached_property
    def status(self) -> str:
        return self.prefix + "status"

    @functools.cached_property
    def closed(self) -> str:
        return self.prefix + "closed"

    @functools.cached_property
    def departed_prefix(self) -> str:
        return self.prefix + "departed/"

    def departed(self, member_id: str) -> str:
        return self.departed_prefix + member_id

    @functools.cached_property
    def incidents_prefix(self) -> str:
        return self.prefix + "incidents/"

    def incidents(self, round_number: int) -> str:
        return f"{self.incidents_prefix}{round_number}/"

    def incident(self, round_number: int, member_id: str) -> str:
        return f"{self.incidents(round_number)}{member_id}"

    @functools.cached_property
    def alive_prefix(self) -> str:
        return self.prefix + "alive/"

    def alive(self, round_number: int) -> str:
        return f"{self.alive_prefix}{round_number}/"

    def alive_member(self, round_number: int, member_id: str) -> str:
        return f"{self.alive(round_number)}{member_id}"

    @functools.cached_property
    def progress(self) -> str:
        return self.prefix + "progress"

    @functools.cached_property
    def done_prefix(self) -> str:
        return self.prefix + "done/"

    def done(self, member_id: str) -> str:
        return self.done_prefix + member_id

    @functools.cached_property
    def store_root(self) -> str:
        return self.prefix + "store/"

    def store(self, round_number: int) -> str:
        return f"{self.store_root}{round_number}/"

    @functools.cached_property
    def workers_prefix(self) -> str:
        return self.prefix + "workers/"

    def worker(self, worker_id: str) -> str:
        return self.workers_prefix + worker_id

    @functools.cached_property
    def worker_exits_prefix(self) -> str:
        return self.prefix + "exits/"

    def worker_exit(self, worker_id: str) -> str:
        """Where a worker's agent records its own exit code, for a controller that did not start it."""
        return self.worker_exits_prefix + worker_id

    @functools.cached_property
    def logs_prefix(self) -> str:
        return self.prefix + "logs/"

    def log(self, worker_id: str) -> str:
        """Where a local worker's log file is recorded; kept after the worker ends (`elastic logs`, the root
        cause of a failed job), unlike `workers/<name>`, which is dropped once its end was handled."""
        return self.logs_prefix + worker_id


def job_keys_prefix() -> str:
    """Prefix of every job's keys, for listing jobs."""
    return ROOT + "jobs/"


def controller_leader_key(backend: str = "local") -> str:
    """The leased key of the acting controller of a backend (one per etcd and backend: a local controller
    and a Kubernetes one sharing an etcd act on different jobs); its mod revision is the epoch."""
    return ROOT + ("controllers/leader" if backend == "local" else f"controllers/{backend}-leader")
