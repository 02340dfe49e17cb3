"""Where a recovery's time goes: one fault per variant, with torch's agent logging at INFO.

For each variant it starts 2 agents, injects one fault (`--fault node_loss`: SIGKILL the agent that is not
rank 0 / not the c10d store host; `worker_crash`: SIGKILL one worker) and splits the time from the fault to
the first step of the new round into phases, from the timestamps torch's agent logs on the agent that
ends up as rank 0:

  detect      fault -> the agent logs its worker's failure (or, for a membership change, stops its workers)
  rendezvous  "Rendezvous'ing worker group" -> "Rendezvous complete" (the backend's next_rendezvous)
  hand-off    failure -> rendezvous start, and rendezvous complete -> "Starting worker group"
  worker      "Starting worker group" -> first training step (Python + torch import, gloo init, checkpoint)
"""

from __future__ import annotations

import argparse
import datetime
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a script: bench/ is on sys.path, the repo root (bench, harness) is not
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.agentjob import BenchJob
from bench.recovery import BY_NAME, Variant

# torch's log prefix: I1202 13:31:03.394000 14294 path:line] message
TORCH_LOG = re.compile(r"^[IWE](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2}\.\d+) \d+ \S+\] (.*)$")
MARKERS = {
    "failed": re.compile(r"failed \(exitcode"),
    "stop": re.compile(r"Stopping worker group|Sending process \d+ closing signal"),
    "rdzv_start": re.compile(r"Rendezvous'ing worker group"),
    "rdzv_done": re.compile(r"Rendezvous complete for workers"),
    "starting": re.compile(r"Starting worker group"),
}


def events(text: str, after: float) -> dict[str, float]:
    """The first time of each marker after `after`, from one agent's log."""
    found: dict[str, float] = {}
    year = datetime.datetime.now().year
    for line in text.splitlines():
        m = TORCH_LOG.match(line)
        if not m:
            continue
        month, day, hour, minute, second, message = m.groups()
        stamp = datetime.datetime(year, int(month), int(day), int(hour), int(minute)).timestamp() + float(second)
        if stamp < after:
            continue
        for name, pattern in MARKERS.items():
            if name not in found and pattern.search(message):
                found[name] = stamp
    return found


def one(variant: Variant, fault: str, etcd_url: str, root: Path, timeout: float) -> list[str]:
    endpoint = etcd_url if variant.backend == "etcd-v3" else f"127.0.0.1:{common.free_port()}"
    job = BenchJob(Path(tempfile.mkdtemp(prefix=f"timeline-{variant.name}-", dir=root)), variant.backend, endpoint,
                   "1:4", variant.conf, env={"LOGLEVEL": "INFO"}, label="timeline")
    try:
        t0 = time.time()
        job.add()
        job.add()
        if not job.wait_steady(2, t0, 10, 300):
            return [variant.name, fault, "did not start"]
        known = job.round_keys()
        if fault == "node_loss":
            keep = job.store_host() if variant.backend == "c10d" else job.rank0_agent()
            victim = 1 - (keep if keep is not None else 0)
            t = time.time()
            job.agents[victim].kill()
            want, agents = 1, {1 - victim}
        else:
            t = time.time()
            job.agents[0].kill_worker()
            want, agents = 2, None
        got = job.wait_for(lambda: job.first_new_round_step(t, want, known, agents), timeout)
        if got is None:
            return [variant.name, fault, "no recovery"]
        ev = events(job.agents[got.agent].output(), t)
        detect = min((ev[k] for k in ("failed", "stop") if k in ev), default=float("nan"))

        def span(a: float, b: float) -> str:
            return f"{b - a:.2f}" if a == a and b == b else "?"

        nan = float("nan")
        return [
            variant.name, fault, f"{got.step.time - t:.2f}", span(t, detect),
            span(detect, ev.get("rdzv_start", nan)), span(ev.get("rdzv_start", nan), ev.get("rdzv_done", nan)),
            span(ev.get("rdzv_done", nan), ev.get("starting", nan)), span(ev.get("starting", nan), got.step.time),
        ]
    finally:
        job.stop()
        shutil.rmtree(job.root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="etcd-v3,c10d-equal,c10d-aggressive")
    parser.add_argument("--faults", default="node_loss,worker_crash")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=150.0)
    args = parser.parse_args(argv)
    env = common.environment()
    common.print_environment(env)
    root = Path(tempfile.mkdtemp(prefix="elastic-bench-timeline-"))
    rows = []
    with common.etcd_server() as etcd:
        for fault in args.faults.split(","):
            for _ in range(args.repeat):
                for name in args.variants.split(","):
                    row = one(BY_NAME[name], fault, etcd.client_url, root, args.timeout)
                    common.log(" ".join(row))
                    rows.append(row)
    shutil.rmtree(root, ignore_errors=True)
    print(common.table(["variant", "fault", "total s", "detect", "failure -> rdzv start", "rendezvous",
                        "rdzv -> start workers", "worker start -> first step"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
