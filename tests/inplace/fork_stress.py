"""Fork thousands of times from a process that follows its job as a training process does, while etcd is
busy under the job's prefix and every core is loaded; print one JSON line of counts.

Run by `test_fork_safety.py` in a process of its own (a hang must be a timeout of that process, not of the
test runner). Every fork kind a training script uses: a bare `os.fork`, a DataLoader with worker processes
per "step" (PyTorch's default, `persistent_workers=False`), `multiprocessing.Pool`, and `subprocess`.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from elastic.store import GatewayStore, JobKeys
from elastic.train.context import WorkerContext
from elastic.train.progress import ProgressReporter
from elastic.train.rounds import RoundFollower


def square(x: int) -> int:
    return x * x


def fork_and_reap() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 7


def main() -> None:
    endpoints, job = sys.argv[1], JobKeys.parse(sys.argv[2])
    forks, loaders, pools, commands = (int(n) for n in sys.argv[3:7])
    follower = RoundFollower(WorkerContext(endpoints=endpoints, job=job, member="m0", local_rank=0,
                                           local_world_size=1))
    progress = ProgressReporter(job.prefix + "progress", endpoints)
    stop = threading.Event()

    def busy_etcd() -> None:  # the follower's watch thread reads events all the while
        with GatewayStore(endpoints) as writer:
            n = 0
            while not stop.is_set():
                writer.put(job.prefix + f"noise/{n % 50}", "x" * 200)
                n += 1

    writer = threading.Thread(target=busy_etcd, daemon=True)
    writer.start()
    data = TensorDataset(torch.arange(64, dtype=torch.float32))
    done = {"forks": 0, "loader_batches": 0, "pool_results": 0, "commands": 0}
    started = time.monotonic()
    for i in range(forks):
        fork_and_reap()
        done["forks"] += 1
        if i % 100 == 0:
            progress.report(i, None, 1, forks, final=True)
    for _ in range(loaders):
        done["loader_batches"] += sum(1 for _ in DataLoader(data, batch_size=8, shuffle=True, num_workers=2))
    for _ in range(pools):
        with multiprocessing.get_context("fork").Pool(2) as pool:
            done["pool_results"] += len(pool.map(square, range(4)))
    for _ in range(commands):
        subprocess.run(["true"], check=True)
        done["commands"] += 1
    stop.set()
    writer.join(timeout=10)
    events = follower.view.revision
    follower.close()
    progress.close()
    done.update(seconds=round(time.monotonic() - started, 1), view_revision=events,
                grpc_imported=any(m == "grpc" or m.startswith(("grpc.", "pyetcd")) for m in sys.modules))
    print(json.dumps(done), flush=True)


if __name__ == "__main__":
    main()
