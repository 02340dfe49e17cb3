"""`elastic agent --recovery=in-place`: a torchrun-compatible agent that keeps survivors running.

torch's agent restarts every local worker on any membership change; that is its design, and a restart
costs a Python start, `import torch`, a process group and a checkpoint load. This agent takes the same
arguments, rendezvous through the same etcd-v3 handler (same rounds, same budget: one charge per incident,
voluntary changes free) and differs in what it does to its workers:
- a worker that dies is replaced alone, by a fork of a warm zygote (torch already imported), while the
  agent ends the round; the survivors, here and on other nodes, rebuild their group in place;
- a round ended elsewhere (a lost node, a scale-up) is re-joined without touching the workers;
- a worker exit is seen when it happens (the process sentinel), not at the next monitor tick.
Workers that do not use `elastic.train.Session` cannot follow rounds: they are restarted together on any
change, as torchrun does, only from the warm zygote.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.rendezvous import RendezvousInfo, RendezvousParameters
from torch.distributed.launcher.api import LaunchConfig
from torch.distributed.run import config_from_args, get_args_parser

from elastic.cluster.processes import process_state
from elastic.inplace.zygote import WorkerCommand, Zygote
from elastic.policy.hang import frozen
from elastic.policy.inplace import Finish, Keep, Rejoin, Replace, ReportLostPeer, RestartAll, next_step
from elastic.rendezvous.handler import EtcdV3RendezvousHandler
from elastic.rendezvous.plugin import create_handler
from elastic.rendezvous.worker_exits import recorded_error
from elastic.train.context import HUNG_EXIT, Heartbeat, Marker, WorkerContext

log = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 5.0


class InPlaceAgent:
    def __init__(self, config: LaunchConfig, command: WorkerCommand, handler: EtcdV3RendezvousHandler) -> None:
        self.config = config
        self.command = command
        self.handler = handler
        self.nproc = int(config.nproc_per_node)
        self.zygote = Zygote()
        self.markers = Path(tempfile.mkdtemp(prefix="elastic-inplace-"))
        self.workers: dict[int, BaseProcess] = {}
        self.exits: dict[int, int | None] = {}
        self.info: RendezvousInfo | None = None
        self.rejoins = 0
        self.broken_since: float | None = None
        self.heartbeats: dict[int, tuple[int, Heartbeat]] = {}  # local rank -> (its worker's pid, heartbeat)
        self.frozen: dict[int, str] = {}  # local rank -> why its agent ended it (it could not end itself)

    def run(self) -> int:
        self.zygote.warm()
        self.info = self.handler.next_rendezvous()
        self._start(range(self.nproc))
        while True:
            self._wait_for_exits(self.config.monitor_interval)
            self._end_frozen_workers()
            waiting = self.handler.num_nodes_waiting() > 0
            markers = self._markers()
            step = next_step(self.exits, frozenset(markers), waiting, self._broken_for(markers))
            if isinstance(step, Keep):
                continue
            if isinstance(step, Finish):
                self.handler.report_local_success()
                return 0
            if isinstance(step, Replace):
                self._replace(step)
            elif isinstance(step, RestartAll):
                self._restart_all(step.failure)
            elif isinstance(step, ReportLostPeer):
                log.warning("a peer vanished and nobody reported it: ending round %s for it", self.handler.joined_round)
                self.handler.report_lost_peer()
                self._rejoin()
            elif isinstance(step, Rejoin):
                if step.restart_all:
                    self._restart_all(None)
                else:
                    self._rejoin()

    # --- the steps ---

    def _replace(self, step: Replace) -> None:
        """Fork the replacements first (they start while the round ends), then end it and re-join."""
        if step.failure is not None:
            self._report(step.failure, step.ranks)
            log.warning("local worker(s) %s failed (exit %s): replaced in place", list(step.ranks), step.failure)
        for rank in step.ranks:  # each joins rounds after the last its predecessor was in
            marker = Marker.read(self.markers, rank)
            last = marker.round if marker is not None and marker.round is not None else self.handler.joined_round
            self._start([rank], after_round=last)
        if step.failure is not None or self.handler.num_nodes_waiting() > 0:
            self._rejoin()

    def _report(self, exit_code: int, ranks: Sequence[int]) -> None:
        """Hand the failure to the handler: its exit code, now (the sentinel woke this loop as it died), and the
        error the first failed rank's `@record` left in its error file, if any."""
        errors = (self.frozen.get(rank) or recorded_error(self._error_file(rank)) for rank in ranks
                  if self.exits.get(rank))
        self.handler.report_worker_failure(exit_code, time.time(), next((e for e in errors if e), None))

    def _restart_all(self, failure: int | None) -> None:
        failed = [rank for rank, code in self.exits.items() if code]
        self._stop_all()
        if failure is not None:
            self._report(failure, failed)
        self._rejoin()
        self._start(range(self.nproc))

    def _rejoin(self) -> None:
        self.info = self.handler.next_rendezvous()
        self.rejoins += 1

    # --- the workers ---

    def _start(self, ranks: Sequence[int] | range, after_round: int | None = None) -> None:
        for local_rank in ranks:
            (self.markers / str(local_rank)).unlink(missing_ok=True)
            Heartbeat.path(self.markers, local_rank).unlink(missing_ok=True)
            self.frozen.pop(local_rank, None)
            if local_rank in self.heartbeats:
                self.heartbeats.pop(local_rank)[1].close()
            env = {**self._env(local_rank), **self._context(local_rank, after_round).env()}
            Path(env["TORCHELASTIC_ERROR_FILE"]).unlink(missing_ok=True)  # a new process has written no error yet
            command = WorkerCommand(self.command.entry, self.command.args, self.command.module, env, self.command.cwd)
            self.workers[local_rank] = self.zygote.start(command, name=f"worker-{local_rank}")
            self.exits[local_rank] = None

    def _context(self, local_rank: int, after_round: int | None) -> WorkerContext:
        config = self.handler.config
        return WorkerContext(
            endpoints=config.endpoints, job=config.job, member=self.handler.member_id, local_rank=local_rank,
            local_world_size=self.nproc, after_round=after_round, marker_dir=str(self.markers), auth=config.auth,
        )

    def _env(self, local_rank: int) -> dict[str, str]:
        """torchrun's variables for the current round (what a stock script reads at start)."""
        assert self.info is not None
        bootstrap = self.info.bootstrap_store_info
        world_size = self.info.world_size * self.nproc
        env = {
            "LOCAL_RANK": str(local_rank),
            "RANK": str(self.info.rank * self.nproc + local_rank),
            "GROUP_RANK": str(self.info.rank),
            "ROLE_RANK": str(self.info.rank * self.nproc + local_rank),
            "ROLE_NAME": self.config.role,
            "LOCAL_WORLD_SIZE": str(self.nproc),
            "WORLD_SIZE": str(world_size),
            "GROUP_WORLD_SIZE": str(self.info.world_size),
            "ROLE_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": bootstrap.master_addr if bootstrap else "127.0.0.1",
            "MASTER_PORT": str(bootstrap.master_port if bootstrap else 0),
            "TORCHELASTIC_RESTART_COUNT": str(self.rejoins),
            "TORCHELASTIC_MAX_RESTARTS": str(self.config.max_restarts),
            "TORCHELASTIC_RUN_ID": self.config.run_id,
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            "TORCHELASTIC_ERROR_FILE": self._error_file(local_rank),  # torch's @record writes it
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            **self.handler.config.auth.env(),
        }
        if self.nproc > 1 and "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = "1"
        return env

    def _error_file(self, local_rank: int) -> str:
        return str(self.markers / f"error-{local_rank}.json")

    def _broken_for(self, markers: dict[int, Marker]) -> float | None:
        """Seconds since a local worker said the group of the current round broke under it (None: none did)."""
        current = self.handler.joined_round
        if not any(m.broken == current for m in markers.values()):
            self.broken_since = None
            return None
        if self.broken_since is None:
            self.broken_since = time.monotonic()
        return time.monotonic() - self.broken_since

    def _markers(self) -> dict[int, Marker]:
        """Each local rank whose current process announced it follows rounds (elastic.train.Session), with
        what its marker says; read once per turn of the loop."""
        markers = {rank: Marker.read(self.markers, rank) for rank in self.workers}
        return {rank: m for rank, m in markers.items() if m is not None and m.pid == self.workers[rank].pid}

    def _wait_for_exits(self, timeout: float) -> None:
        """Until a worker exits, the job's keys move (a round ended elsewhere, a joiner waits) or `timeout`.

        Woken by the keys, a survivor re-joins as soon as a peer ended the round, not at its next monitor tick:
        the next round seals only once its slowest member is back.
        """
        changes = self.handler.changes
        running = {p.sentinel: rank for rank, p in self.workers.items() if self.exits[rank] is None}
        ready = wait([*running, changes], timeout=timeout)
        if changes in ready:
            changes.clear()
        for sentinel in ready:
            rank = running.get(sentinel)  # type: ignore[call-overload]
            if rank is None:
                continue
            self.workers[rank].join()
            self.exits[rank] = HUNG_EXIT if rank in self.frozen else self.workers[rank].exitcode

    def _end_frozen_workers(self) -> None:
        """SIGKILL a worker that is past its step deadline and cannot run (stopped, uninterruptible): its own
        watchdog never will, and its peers would wait for it in their all-reduce while the round holds. It ends
        as a hung worker (exit 87, charged once), and its death frees its peers' collective."""
        now = time.monotonic()
        for rank, process in self.workers.items():
            if self.exits[rank] is not None or rank in self.frozen or process.pid is None:
                continue
            beat = self._heartbeat(rank, process.pid)
            seen = beat.read() if beat is not None else None
            if seen is None:
                continue
            kind, since, deadline = seen
            state = process_state(process.pid)
            if frozen(kind, since, deadline, now, state):
                self.frozen[rank] = (f"WorkerFrozenError: worker {rank} (pid {process.pid}) could not run "
                                     f"(process state {state}) and "
                                     f"was {now - since:.1f} s into its {kind}, past its step deadline of "
                                     f"{deadline:.1f} s: ended by its agent")
                log.warning("%s", self.frozen[rank])
                os.kill(process.pid, signal.SIGKILL)

    def _heartbeat(self, rank: int, pid: int) -> Heartbeat | None:
        """The heartbeat of the worker now at `rank` (its Session creates it; a stock script has none)."""
        known = self.heartbeats.get(rank)
        if known is not None and known[0] == pid:
            return known[1]
        try:
            beat = Heartbeat(Heartbeat.path(self.markers, rank))
        except (OSError, ValueError):
            return None
        self.heartbeats[rank] = (pid, beat)
        return beat

    def _stop_all(self) -> None:
        running = [p for rank, p in self.workers.items() if self.exits[rank] is None]
        for process in running:
            process.terminate()
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for process in running:
            process.join(max(deadline - time.monotonic(), 0))
            if process.exitcode is None:
                process.kill()
                process.join()

    def close(self) -> None:
        self._stop_all()
        shutil.rmtree(self.markers, ignore_errors=True)


def _raise_signal(signum: int, _frame: object) -> None:
    raise SignalException(f"agent got signal {signum}", sigval=signal.Signals(signum))


def run(argv: Sequence[str]) -> int:
    """Parse torchrun's arguments, rendezvous through etcd-v3, keep the workers until the job ends."""
    config, cmd, cmd_args = config_from_args(get_args_parser().parse_args(list(argv)))
    if config.rdzv_backend != "etcd-v3":
        raise SystemExit("elastic agent --recovery=in-place: needs --rdzv-backend=etcd-v3 (rounds are read from etcd)")
    module = "-m" in cmd_args[:2]
    entry_index = cmd_args.index("-m") + 1 if module else (1 if cmd_args and cmd_args[0] == "-u" else 0)
    if not cmd.endswith(("python", "python3")) and os.path.basename(cmd) != os.path.basename(sys.executable):
        raise SystemExit(f"elastic agent --recovery=in-place: the worker command must run Python (python "
                         f"script.py or python -m module), not {cmd!r}: workers are forks of a Python process")
    command = WorkerCommand(cmd_args[entry_index], tuple(cmd_args[entry_index + 1 :]), module, cwd=os.getcwd())
    # Survivors do not exit, so there are no collateral reports to wait for: only the live peers' answers,
    # which come within milliseconds (the settle ends as soon as every member was heard from).
    conf = {"settle_seconds": 0.5, **config.rdzv_configs}
    params = RendezvousParameters(config.rdzv_backend, config.rdzv_endpoint, config.run_id, config.min_nodes,
                                  config.max_nodes, config.local_addr, **conf)
    handler = create_handler(params)
    assert isinstance(handler, EtcdV3RendezvousHandler)
    handler.settle_until_heard = True
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, _raise_signal)
    agent = InPlaceAgent(config, command, handler)
    try:
        code = agent.run()
    finally:
        # Leave first: a departure recorded before the workers stop ends the round for what it is (a stop, a
        # scale-down), not as the lost peer the others' broken groups would otherwise report.
        handler.shutdown()
        agent.close()
    return code
