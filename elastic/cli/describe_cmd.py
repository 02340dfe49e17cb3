"""`elastic describe JOB`: one job in full, as `kubectl describe` tells an object's story.

The spec in short, the status, the conditions, every charge of the restart budget (reason, cause, exit
code, round, time), the workers' logs, the failing worker's last lines, and an events timeline. Locally
there is no event store: the timeline is derived from the conditions' last transitions and the charges,
and says no more than those records do. A run torchrun started with no spec is described from its
rendezvous keys: rounds, members, budget, last incident.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from elastic.cli.common import add_etcd_option, connect
from elastic.cli.runs import STARTED_BY, RunReport, find_run
from elastic.cli.show import age, columns, controller_leading, require_job, root_cause_lines
from elastic.controller.inspect import JobReport, read_report, timeline
from elastic.controller.status import timestamp
from elastic.policy.bounds import clamp_replicas
from elastic.policy.budget import Budget
from elastic.store import JobKeys


def register(verbs: argparse._SubParsersAction) -> None:
    describe = verbs.add_parser("describe", help="show one job in full: spec, conditions, budget, events",
                                description=__doc__.split("\n\n")[0])
    describe.add_argument("job", help="namespace/name or name")
    add_etcd_option(describe)
    describe.set_defaults(run=describe_cmd)


def describe_cmd(args: argparse.Namespace) -> int:
    keys = JobKeys.parse(args.job)
    with connect(args) as store:
        run = find_run(store, keys)
        if run is not None:
            print("\n".join(describe_run(run)))
            return 0
        report = read_report(store, require_job(store, keys, args.etcd))
        leader = controller_leading(store)
    print("\n".join(describe(report, leader)))
    return 0


def describe(report: JobReport, leader: dict[str, Any] | None = None) -> list[str]:
    """The text of `elastic describe` (pure: the report and the leader key's record hold everything)."""
    job, status, budget = report.job, report.status, report.state.budget
    spec = job.spec
    progress = status.get("progress", {})
    lines = [
        f"Name:          {job.metadata.name}",
        f"Namespace:     {job.metadata.namespace}",
        f"Run:           {report.state.run_id or job.metadata.uid or '-'}",  # the id the agents joined with
        f"Phase:         {status.get('phase', 'Pending')}" + (f" ({status['reason']})" if status.get("reason") else ""),
        f"Message:       {status.get('message', '-')}",
        f"Start Time:    {status.get('startTime', '-')}",
        f"Completed:     {status.get('completionTime', '-')}",
        f"Age:           {age(status)}",
        "Controller:    " + (f"{leader['holder']} leads" if leader else
                             "none running (no leader key): 'elastic controller' runs submitted jobs"),
        "Spec:",
        f"  Replicas:    {clamp_replicas(spec.replicas, spec.min_replicas, spec.max_replicas)} (min "
        f"{spec.min_replicas}, max {spec.max_replicas}), nprocPerNode {spec.nproc_per_node}",
        f"  Worker:      {' '.join([*spec.worker.command, *spec.worker.args])}",
        f"  Policies:    restartPolicy {spec.restart_policy.value}, successPolicy {spec.success_policy.value}, "
        f"maxRestarts {spec.failure_policy.max_restarts}, {len(spec.failure_policy.rules)} failure rule(s)",
        "Status:",
        f"  Round:       {status.get('round', '-')} (world size {status.get('worldSize', '-')})",
        f"  Replicas:    {status.get('replicasText', '-')} (active/desired)",
        *([f"  Spares:      {spares.get('ready', 0)}/{spares.get('wanted', 0)} (ready/wanted)"]
          if (spares := status.get("spares") or {}) else []),
        f"  Restarts:    {status.get('restartsText', '-')} (used/max)",
        "  Progress:    " + (f"step {progress['step']}, loss {progress.get('loss', float('nan')):.4f}"
                             if "step" in progress else "-"),
        "Conditions:",
        *_table(("TYPE", "STATUS", "REASON", "LAST TRANSITION", "MESSAGE"),
                [(c.get("type", ""), c.get("status", ""), c.get("reason", ""), c.get("lastTransitionTime", ""),
                  c.get("message", "")) for c in status.get("conditions", [])]),
    ]  # fmt: skip
    charges = budget.charges if budget else ()
    lines += _budget(budget)
    lines += ["Workers:", *_table(("WORKER", "STARTED", "LOG"),
                                  [(w.worker, timestamp(w.started_at), w.path) for w in report.logs])]
    cause = root_cause_lines(report, include_restarts=True)
    if cause:
        lines += ["Last Failure:", *(f"  {line}" for line in cause)]
    events = timeline(status, charges, timestamp)
    lines += ["Events:", *_table(("TIME", "TYPE", "REASON", "MESSAGE"),
                                 [(e.at, e.kind, e.reason, e.message) for e in events])]
    return lines


def describe_run(run: RunReport) -> list[str]:
    """The text of `elastic describe` for a run torchrun started with no spec: its rounds, members, budget
    and last incident, as its rendezvous keys hold them (pure)."""
    state, status = run.state, run.status
    current = state.round
    ranks = current.members if current is not None and current.sealed else {}
    last = state.budget.charges[-1] if state.budget and state.budget.charges else None
    lines = [
        f"Name:          {run.keys.name}",
        f"Namespace:     {run.keys.namespace}",
        f"Run:           {state.run_id or '-'}",
        f"Started By:    {STARTED_BY}",
        f"Phase:         {status['phase']} ({status['reason']})",
        f"Message:       {status['message']}",
        "Round:         " + ("-" if current is None else
                             f"{current.number} ({'sealed' if current.sealed else 'forming'}, world size "
                             f"{current.world_size}, opened by {current.opened_by} at {timestamp(current.opened_at)})"),
        "Members:",
        *_table(("MEMBER", "RANK", "HOST", "PID", "JOINED"),
                [(m.id, str(ranks.get(m.id, "-")), m.host or "-", str(m.pid or "-"), timestamp(m.joined_at))
                 for m in sorted(state.members.values(), key=lambda m: (ranks.get(m.id, 1 << 30), m.id))]),
        *_budget(state.budget),
        "Last Incident: " + ("none" if last is None else
                             f"round {last.round} ended: {last.reason}: {last.cause} ({timestamp(last.at)})"),
    ]  # fmt: skip
    if state.closed is not None:
        lines.append(f"Closed:        {state.closed.reason}: {state.closed.message}")
    return lines


def _budget(budget: Budget | None) -> list[str]:
    """The restart budget and each of its charges."""
    used = f"{budget.used} charged, maxRestarts {budget.max}" if budget else "no run yet"
    charges = budget.charges if budget else ()
    return [f"Budget:        {used}",
            *_table(("ROUND", "REASON", "EXIT CODE", "TIME", "CAUSE"),
                    [(str(c.round), c.reason, "-" if c.exit_code is None else str(c.exit_code), timestamp(c.at),
                      c.cause) for c in charges])]  # fmt: skip


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return columns(header, rows, "  ") if rows else ["  <none>"]
