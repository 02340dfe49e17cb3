"""The launcher behind `elastic agent` (`python -m elastic.agent`): torchrun with the etcd-v3 backend as
default and each worker's failure reported to it; `--recovery=in-place` runs the in-place agent instead.

It sits above both agents (restart mode here, in-place in `elastic.inplace`), so that neither imports the
other's layer. Stock torchrun never tells a rendezvous handler *why* it re-rendezvous; without an exit code,
the job's failure rules (FailJob on exit code 3, ...) cannot be applied to a worker crash that the agent
restarts in place. This launcher is torchrun itself (same arguments, same code path) with one addition: its
agent hands its first failed worker's failure (exit code, time of death, its own error) to the handler
before re-rendezvous. It also makes the job budget, not torchrun's per-agent counter, the limit that
matters: `--max-restarts` defaults to a large number here. As it exits, the agent records its own exit code
in etcd (`exit_recorded`), so that a controller that adopted it (and so is not its parent) still applies
the exit-code rules.

Its log is where a failed job's root cause is read (`elastic logs`, `elastic status`), so the agent's own
expected ends are one line each, not tracebacks that bury the worker's error: a closed job (the budget
spent, a FailJob rule, success) and a stop by signal. A stop after its own workers all exited 0 (the
controller winding a finished job down while this agent is still leaving) is a clean exit, code 0.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerSpec, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import LogsSpecs
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
from torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler import SubprocessHandler
from torch.distributed.elastic.rendezvous import RendezvousClosedError

from elastic.cluster.local import exit_recorded
from elastic.cluster.processes import process_state
from elastic.policy.hang import CANNOT_RUN, HangSettings, frozen
from elastic.policy.incident import Failure, first_failure
from elastic.policy.inplace import HUNG_EXIT
from elastic.rendezvous.handler import BACKEND, EtcdV3RendezvousHandler
from elastic.rendezvous.worker_exits import DeathWatch, StderrRelay, capturing, error_text
from elastic.train.context import HANG_FLOOR

log = logging.getLogger(__name__)

# torchrun's per-agent counter would otherwise end an agent long before the job budget is spent.
DEFAULT_AGENT_RESTARTS = 1_000_000

# Set once this agent's own workers all exited 0 (one agent per process): a later stop has nothing to stop.
WORKERS_SUCCEEDED = threading.Event()

QUIET_ENDS = (SignalException, RendezvousClosedError)


class ReportingAgent(LocalElasticAgent):
    """torch's local agent, telling the etcd-v3 handler how its first failed worker ended: exit code, the
    moment it died, the tail of its own error (see `worker_exits`)."""

    def __init__(self, spec: WorkerSpec, logs_specs: LogsSpecs, *args: Any, **kwargs: Any) -> None:
        logs_specs, self._relay_stderr = capturing(logs_specs)
        super().__init__(spec, logs_specs, *args, **kwargs)
        self._deaths = DeathWatch()
        # A stock script tells nothing of its steps: a worker that cannot run (stopped, uninterruptible) for
        # the hang floor is frozen; its own code never will end it, and its peers wait in their all-reduce.
        self._hang_floor = float(os.environ.get(HANG_FLOOR) or HangSettings().floor_seconds)
        self._cannot_run_since: dict[int, float] = {}
        self._frozen: dict[int, str] = {}  # pid -> why this agent ended it

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        pids = super()._start_workers(worker_group)
        for local_rank, pid in pids.items():
            self._deaths.watch(pid)
            stderr = self._stderr_path(local_rank)
            if self._relay_stderr and stderr:
                StderrRelay(stderr, pid, self._deaths)
        return pids

    def _stderr_path(self, local_rank: int) -> str | None:
        paths = getattr(self._pcontext, "stderrs", None) or {}
        return paths.get(local_rank) or None

    def _failure(self, failure: ProcessFailure) -> Failure:
        died = self._deaths.died_at(failure.pid) or time.time()
        if failure.pid in self._frozen:
            return Failure(HUNG_EXIT, at=died, error=self._frozen[failure.pid])
        return Failure(failure.exitcode, at=died, error=error_text(failure, self._stderr_path(failure.local_rank)))

    def _end_frozen_workers(self, worker_group: WorkerGroup) -> None:
        """SIGKILL a worker that could not run for the hang floor (see `elastic.policy.hang.frozen`)."""
        now = time.monotonic()
        for worker in worker_group.workers:
            pid = worker.id
            state = process_state(pid) if isinstance(pid, int) else None
            if state not in CANNOT_RUN:
                self._cannot_run_since.pop(pid, None)
                continue
            since = self._cannot_run_since.setdefault(pid, now)
            if pid not in self._frozen and frozen("step", since, self._hang_floor, now, state):
                self._frozen[pid] = (f"WorkerFrozenError: worker {worker.local_rank} (pid {pid}) could not run "
                                     f"(process state {state}) "
                                     f"for {now - since:.1f} s: ended by its agent")
                log.warning("%s", self._frozen[pid])
                os.kill(pid, signal.SIGKILL)

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        self._end_frozen_workers(worker_group)
        result = super()._monitor_workers(worker_group)
        handler = worker_group.spec.rdzv_handler
        if not isinstance(handler, EtcdV3RendezvousHandler):
            return result
        if result.is_failed() and result.failures:
            first = first_failure(self._failure(f) for f in result.failures.values())
            handler.report_worker_failure(first.exit_code, first.at, first.error, first.stopped)
        elif result.state == WorkerState.SUCCEEDED:
            WORKERS_SUCCEEDED.set()
            handler.report_local_success()
        return result


def workers_die_with_their_agent() -> None:
    """torch starts each worker in a session of its own, so a SIGKILLed agent left it training unsupervised
    (for 41 minutes in one fault campaign, writing the checkpoint directory the next agents resumed from).
    Each worker is started as torch starts it, through util-linux's `setpriv --pdeathsig KILL`, which sets the
    kernel's parent-death signal and execs the worker (the pid stays): the agent's death takes it along. No
    Python runs between fork and exec (a `preexec_fn` there deadlocked a child now and then: the agent has
    gRPC and relay threads). Without `setpriv` the workers start exactly as torch starts them."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        log.warning("setpriv not found (util-linux): a SIGKILLed agent's workers are not stopped with it")
        return

    def popen(self: SubprocessHandler, args: tuple, env: dict[str, str]) -> subprocess.Popen:
        return subprocess.Popen(args=(setpriv, "--pdeathsig", "KILL", "--", *args), env=env,
                                stdout=self._stdout, stderr=self._stderr, start_new_session=True)

    SubprocessHandler._popen = popen  # type: ignore[method-assign]


def with_defaults(argv: Sequence[str]) -> list[str]:
    """torchrun's arguments, adding `--rdzv-backend=etcd-v3` and a high `--max-restarts` unless given."""
    args = list(argv)
    given = {a.split("=", 1)[0].replace("_", "-") for a in args if a.startswith("--")}
    extra = []
    if "--rdzv-backend" not in given:
        extra.append(f"--rdzv-backend={BACKEND}")
    if "--max-restarts" not in given:
        extra.append(f"--max-restarts={DEFAULT_AGENT_RESTARTS}")
    return extra + args


def launch(recovery: str, args: Sequence[str]) -> None:
    """Run torchrun's launcher with this module's agent (restart) or the in-place agent, to the end."""
    import torch.distributed.launcher.api as launcher_api
    from torch.distributed.run import main as torchrun_main

    from elastic.inplace.agent import run as run_in_place

    # launch_agent() builds its agent from this module attribute: the one seam torchrun offers.
    launcher_api.LocalElasticAgent = ReportingAgent  # type: ignore[misc]
    workers_die_with_their_agent()
    with exit_recorded():
        try:
            if recovery == "in-place":
                if run_in_place(with_defaults(args)) == 0:
                    WORKERS_SUCCEEDED.set()
            else:
                torchrun_main(with_defaults(args))
        except QUIET_ENDS as err:
            lines, code = quiet_end(err, WORKERS_SUCCEEDED.is_set())
            for line in lines:
                print(f"elastic agent: {line}", file=sys.stderr, flush=True)
            if code:
                raise SystemExit(code) from None


def quiet_end(error: BaseException, workers_succeeded: bool) -> tuple[list[str], int]:
    """The lines an expected end prints (itself and the expected end it interrupted) and the exit code."""
    lines, seen = [], error
    while isinstance(seen, QUIET_ENDS):
        if isinstance(seen, SignalException):
            lines.append(f"stopped by signal {signal.Signals(seen.sigval).name}")
        else:
            lines.append(str(seen))
        seen = seen.__context__
    if workers_succeeded and isinstance(error, SignalException):
        return [*reversed(lines[1:]), "stopped while leaving, after its workers finished with exit 0"], 0
    return list(reversed(lines)), 1
