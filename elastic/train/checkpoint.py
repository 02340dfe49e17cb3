"""Publish a checkpoint only while this worker's round is the job's current round (the fencing token).

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(state, tmp)                       # write, flush, fsync: as before
    if not elastic.train.checkpoint.publish(tmp, path):
        ...                                      # this round has ended: the next one must not read it

A worker whose round ended (its agent was SIGKILLed and the reaper has not ended it yet, or a peer failed and
its agent has not stopped it yet) would otherwise replace the checkpoint the next round resumes from with a
step that round abandoned. `publish` reads the job's run and round from etcd (over the gateway: no gRPC in a
training process) and renames only if the worker's round is still current; the window left is the
milliseconds between that read and the rename. Outside an etcd-v3 agent (no fence in the environment) it is
a plain `os.replace`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from elastic.codec import RoundRecord, RunRecord, decode_model
from elastic.rendezvous.fence import RoundFence, fence_holds
from elastic.store import EtcdAuth, GatewayStore


def publish(tmp: str | os.PathLike[str], path: str | os.PathLike[str]) -> bool:
    """Rename `tmp` onto `path` if this worker's round is still the job's current one; else remove `tmp`,
    say so on stderr and return False."""
    fence = RoundFence.from_env()
    if fence is not None and not round_is_current(fence):
        Path(tmp).unlink(missing_ok=True)
        print(f"elastic.train: round {fence.round} of {fence.job.namespace}/{fence.job.name} has ended; "
              f"{path} is left as the current round has it", file=sys.stderr, flush=True)
        return False
    os.replace(tmp, path)
    return True


def round_is_current(fence: RoundFence) -> bool:
    keys = fence.job
    with GatewayStore(fence.endpoints, auth=EtcdAuth.from_env(), timeout=2, retry_seconds=10) as store:
        entries, _ = store.get_ranges([(keys.run, keys.run + "\0"), (keys.round, keys.round + "\0")])
    found = {entry.key: entry.value for entry in entries}
    run = decode_model(RunRecord, keys.run, found[keys.run]) if keys.run in found else None
    current = decode_model(RoundRecord, keys.round, found[keys.round]) if keys.round in found else None
    return fence_holds(fence, run.run_id if run else None, current.round if current else None,
                       bool(current and current.sealed))
