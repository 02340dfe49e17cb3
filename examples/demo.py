"""The main demo until the controller lands: a real elastic run on this machine.

Starts a managed etcd (v3 API only), then two `elastic agent` processes (torchrun with the `etcd-v3`
backend) training `examples/train_ddp.py` with DDP on gloo. One worker crashes once with exit code 137;
the job re-rendezvous, resumes from its checkpoint, charges the job budget once, and finishes. Progress and
the final etcd state are printed as they happen.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from elastic.agents import AgentProcess, torchrun_command
from elastic.store import JobKeys, Store
from elastic.store.server import EtcdServer

ELASTIC_AGENT = (sys.executable, "-m", "elastic.rendezvous.agent")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--crash-at-step", type=int, default=40)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="elastic-demo-"))
    run_id = "demo"
    keys = JobKeys.parse(f"default/{run_id}")
    script_args = [
        "--steps", str(args.steps), "--step-seconds", "0.05", "--checkpoint-every", "10",
        "--checkpoint-dir", str(workdir / "checkpoints"),
        "--crash-at-step", str(args.crash_at_step), "--crash-exit-code", "137",
        "--crash-once-marker", str(workdir / "crashed-once"),
    ]  # fmt: skip
    with EtcdServer() as etcd, Store(etcd.client_url) as store:
        print(f"etcd {etcd.version} at {etcd.client_url}; logs and checkpoints in {workdir}")
        command = torchrun_command(
            etcd.client_url, run_id, f"1:{args.agents}", script_args,
            conf={"max_restarts": 3, "last_call_seconds": 1}, launcher=ELASTIC_AGENT,
        )  # fmt: skip
        agents = [AgentProcess(command, workdir / f"agent{i}.log").start() for i in range(args.agents)]
        try:
            shown = _follow(agents, store, keys)
        finally:
            for agent in agents:
                agent.stop()
        print("\n$ etcdctl get --prefix /elastic/  (the run's state; workers' store keys left out)")
        entries, _ = store.get_prefix(keys.prefix)
        for entry in entries:
            if not entry.key.startswith(keys.store_root):
                print(entry.key)
                print(entry.value.decode())
        codes = [a.returncode for a in agents]
        closed = store.get_json(keys.closed) or {}
        print(f"\nagents exited {codes}; job {closed.get('reason', 'not closed')}; {shown} steps shown")
        return 0 if codes == [0] * len(codes) and closed.get("reason") == "Succeeded" else 1


def _follow(agents: list[AgentProcess], store: Store, keys: JobKeys) -> int:
    """Print rounds, charges and training steps until every agent has exited."""
    seen_steps, seen_round, seen_used = 0, None, 0
    while any(a.returncode is None for a in agents):
        time.sleep(0.5)
        rnd = store.get_json(keys.round) or {}
        budget = store.get_json(keys.budget) or {}
        if (rnd.get("round"), rnd.get("sealed")) != seen_round:
            seen_round = (rnd.get("round"), rnd.get("sealed"))
            state = f"sealed, world size {rnd.get('world_size')}" if rnd.get("sealed") else "open (gathering)"
            print(f"round {rnd.get('round')}: {state} (opened by {rnd.get('opened_by')})")
        if budget.get("used", 0) != seen_used:
            seen_used = budget["used"]
            last = budget["charges"][-1]
            print(f"budget {seen_used}/{budget['max']} used: round {last['round']} {last['reason']}: {last['cause']}")
        steps = sorted((s for a in agents for s in a.steps()), key=lambda s: s.time)
        for step in steps[seen_steps:]:
            if step.step % 10 == 0:
                print(f"  step {step.step:4d}  loss {step.loss:.4f}  world size {step.world_size}")
        seen_steps = len(steps)
    return seen_steps


if __name__ == "__main__":
    sys.exit(main())
