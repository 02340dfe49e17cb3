"""What training in place costs a DDP script at steady state: the DDP tutorial's script under stock torchrun
beside its converted twin under in-place agents, in one run (issue 45).

  stock      examples/ddp_tutorial/stock.py: stock torchrun (c10d), torch's DDP, DataLoader and
             DistributedSampler
  in-place   examples/ddp_tutorial/inplace.py (five lines changed): `elastic agent --recovery=in-place` on
             etcd-v3; DDP on the session's group (a hook averaging each bucket over the round, buckets kept as
             built), the commit gate's one-number all-reduce at each optimizer.step(), the loader's layout

Each job: 2 agents, 1 worker each, gloo on CPU, `--hidden 1024` (4.3 MB of parameters), `--epochs` epochs of
the 2048-sample dataset at 32 a rank (32 steps an epoch). Rank 0 prints each epoch's time; an epoch after
the first is one window, its step time = its time / its steps. The variants take turns (A B A B ...)
`--repeats` times; the report gives each one's median step time over all windows, and the ratio.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a script: bench/ is on sys.path, the repo root (bench, harness) is not
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from harness.agents import AgentProcess, torchrun_command, wait_until

TUTORIAL = common.REPO / "examples" / "ddp_tutorial"
EPOCH = re.compile(r"^epoch=(\d+) batches=(\d+) seconds=([\d.]+)$", re.M)
VARIANTS = {
    "stock": ("c10d", common.TORCHRUN, TUTORIAL / "stock.py", "stock torchrun (c10d defaults), torch's DDP"),
    "in-place": ("etcd-v3", (common.PYTHON, "-m", "elastic.agent", "--recovery=in-place"), TUTORIAL / "inplace.py",
                 "elastic agent --recovery=in-place (etcd-v3 defaults), the converted script"),
}


def run_job(name: str, endpoint: str, root: Path, args: argparse.Namespace) -> list[float]:
    """One job of `name` to its end: rank 0's step times (s) of every epoch after the first."""
    backend, launcher, script, _ = VARIANTS[name]
    if backend == "c10d":
        endpoint = f"127.0.0.1:{common.free_port()}"
    script_args = [str(args.epochs), str(args.epochs + 1), "--hidden", str(args.hidden),
                   "--snapshot-path", str(root / "snapshot.pt")]
    run_id = f"overhead-{name}-{time.time_ns() % 10**9}"
    agents = [AgentProcess(torchrun_command(endpoint, run_id, "2:2", script_args, backend=backend,
                                            launcher=launcher, script=script), root / f"agent{i}.log").start()
              for i in range(2)]
    try:
        ended = wait_until(lambda: all(a.returncode is not None for a in agents), args.timeout)
        output = "\n".join(a.output() for a in agents)
        if not ended or any(a.returncode != 0 for a in agents):
            common.log(f"{name}: the job did not end cleanly (logs in {root})\n{output[-2000:]}")
            return []
    finally:
        for agent in agents:
            agent.stop()
    return [float(m[3]) / int(m[2]) for m in EPOCH.finditer(output) if int(m[1]) > 0 and int(m[2]) > 0]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=4, help="jobs per variant, taking turns (default 4)")
    parser.add_argument("--epochs", type=int, default=6, help="epochs per job; the first is a warm-up (default 6)")
    parser.add_argument("--hidden", type=int, default=1024, help="the model's width (default 1024: 4.3 MB)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one job may take")
    args = parser.parse_args(argv)
    common.print_environment(common.environment())
    root = Path(tempfile.mkdtemp(prefix="elastic-bench-overhead-"))
    windows: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with common.etcd_server() as etcd:
        for repeat in range(args.repeats):
            for name in VARIANTS:
                job_root = root / f"{name}-{repeat}"
                job_root.mkdir()
                got = run_job(name, etcd.client_url, job_root, args)
                windows[name] += got
                common.log(f"{name} job {repeat}: {len(got)} windows, median step "
                           f"{common.number(common.Summary.of(got).median * 1e3, 2)} ms")
                if got:
                    shutil.rmtree(job_root, ignore_errors=True)
    summaries = {name: common.Summary.of(v * 1e3 for v in values) for name, values in windows.items()}
    print(common.table(["variant", "settings", "step time, ms: median [min-max] n windows"],
                       [(name, VARIANTS[name][3], summaries[name].text(2)) for name in VARIANTS]))
    in_place, stock = summaries["in-place"].median, summaries["stock"].median
    overhead = common.ratio(in_place - stock, stock) * 100
    print(f"\nRESULT dropin_overhead step_ms in_place={common.number(in_place)} stock={common.number(stock)} "
          f"overhead_percent={common.number(overhead, 1)}")
    return 0 if summaries["in-place"].n and summaries["stock"].n else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
