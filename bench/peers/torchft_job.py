"""torchft jobs for bench/hot.py: a lighthouse, one replica group per member, a kill and its replacement.

Why here and not in hot.py: torchft has no agents, rendezvous or launcher; a job is `torchft_lighthouse` plus N
processes of bench/peers/torchft_twin.py (each its own replica group of one process). A `TorchftJob` is read as
the bench reads ours (bench/agentjob.py: one log per member, `started` and `step=` lines, rank 0 prints the
committed steps), so that hot.py's `incident()` measures both by one definition.

A worker crash kills one replica group (SIGKILL; with one process per group that is also a node loss) and
brings its replacement:
  cold   a new twin process, started by the bench right after the kill (imports torch and torchft, builds the
         model, creates its Manager, joins, heals from a peer)
  spare  a twin started before the kill, which has imported everything and built its model and waits for a
         file; the bench creates the file right after the kill, and the spare creates its Manager and joins

Settings: torchft's documented defaults (`torchft_lighthouse --help`: heartbeat timeout 5 s, join timeout 60 s,
quorum tick 100 ms; `Manager` and `ProcessGroupGloo` timeouts 60 s), and tuned ones, the tightest that stayed
stable here: a heartbeat timeout of 0.5 s and gloo/Manager timeouts of 2 s (a heartbeat timeout of 1 s gave
stalls of 1.0-1.4 s). Both bound a recovery: the lighthouse forms the next quorum once the victim's heartbeats
are older than the heartbeat timeout; and with more than 2 members, a survivor that was not exchanging with the
victim when it died learns of it only by gloo's timeout (seen here with 4: `Timed out waiting 2000ms for recv`
while the victim's neighbours had `Connection reset by peer`), 60 s at the defaults.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import socket
import sys
import time
from pathlib import Path

from bench import common
from bench.agentjob import BenchJob, Failure
from harness.agents import AgentProcess

BACKEND = "torchft"
TWIN = Path(__file__).resolve().parent / "torchft_twin.py"
DEFAULTS = {"heartbeat_timeout_ms": 5000, "join_timeout_ms": 60000, "quorum_tick_ms": 100, "timeout_s": 60}
TUNED = DEFAULTS | {"heartbeat_timeout_ms": 500, "timeout_s": 2}
_DEFAULTS_TEXT = "torchft defaults: lighthouse heartbeat timeout 5 s, join timeout 60 s, tick 100 ms; gloo and " \
                 "Manager timeouts 60 s"
_TUNED_TEXT = "tuned: lighthouse heartbeat timeout 0.5 s (join timeout 60 s, tick 100 ms); gloo and Manager " \
              "timeouts 2 s"
_SPARE_TEXT = "replacement: a spare (imported, model built) that joins when the bench creates its file at the kill"
_COLD_TEXT = "replacement: a new process started at the kill"
_COMMON_TEXT = "one process per replica group, ProcessGroupGloo, manual allreduce per gradient; worker_crash only"
TORCHFT = common.Variant("torchft", BACKEND, DEFAULTS | {"spare": True},
                         f"{_DEFAULTS_TEXT}; {_SPARE_TEXT}; {_COMMON_TEXT}")
TORCHFT_COLD = common.Variant("torchft-cold", BACKEND, DEFAULTS | {"spare": False},
                              f"{_DEFAULTS_TEXT}; {_COLD_TEXT}; {_COMMON_TEXT}")
TORCHFT_TUNED = common.Variant("torchft-tuned", BACKEND, TUNED | {"spare": True},
                               f"{_TUNED_TEXT}; {_SPARE_TEXT}; {_COMMON_TEXT}")
TORCHFT_TUNED_COLD = common.Variant("torchft-tuned-cold", BACKEND, TUNED | {"spare": False},
                                    f"{_TUNED_TEXT}; {_COLD_TEXT}; {_COMMON_TEXT}")
TORCHFT_DDP = common.Variant("torchft-ddp", BACKEND, TUNED | {"spare": True, "ddp": True},
                             "as torchft-tuned, with torchft.ddp.DistributedDataParallel (its documented wrapper) "
                             "instead of the manual allreduce; a survivor that crashes is counted as a failure")
VARIANTS = (TORCHFT, TORCHFT_COLD, TORCHFT_TUNED, TORCHFT_TUNED_COLD, TORCHFT_DDP)
EXTRA = (TORCHFT_DDP,)  # run only when asked for by name
REFERENCE = TORCHFT_TUNED  # the RESULT lines' `torchft=`: its best settings with a warm replacement
SCENARIOS = ("worker_crash",)
LIGHTHOUSE_START_SECONDS = 30.0


def missing() -> str | None:
    """None when torchft can run here; else the one line that says why not and how to install it."""
    if importlib.util.find_spec("torchft") is None:
        return ("torchft variants skipped: torchft is not installed (make bench-peers, or "
                "pip install -e '.[peers]')")
    if lighthouse_binary() is None:
        return "torchft variants skipped: no torchft_lighthouse beside this Python or on PATH"
    return None


def lighthouse_binary() -> str | None:
    beside = Path(sys.executable).parent / "torchft_lighthouse"  # the wheel puts it in the venv's bin/
    return str(beside) if beside.exists() else shutil.which("torchft_lighthouse")


class TorchftJob(BenchJob):
    """One lighthouse and its replica groups; `add()` starts a replica, `crash()` kills one and replaces it.

    Members (`agents`, as bench/agentjob.py calls them) are twin processes, each with its own log; a spare joins
    `agents` only when the bench releases it.
    """

    def __init__(self, root: Path, variant: common.Variant, hidden: int, step_seconds: float,
                 spare_timeout: float) -> None:
        super().__init__(root, BACKEND, "", "", variant.conf, label=BACKEND)
        self.variant = variant
        self.script_args = ["--hidden", str(hidden), "--step-seconds", str(step_seconds), "--timeout",
                            str(variant.conf["timeout_s"])]
        if variant.conf.get("ddp"):
            self.script_args.append("--ddp")
        self.spare_timeout = spare_timeout
        self.fired = 0  # (hot.py counts incidents per job)
        self.replicas = 0  # replica ids handed out: a replacement never reuses its victim's
        self.spare: AgentProcess | None = None
        self.killed: set[int] = set()
        self.exits: dict[int, Failure] = {}
        port = common.free_port()
        self.lighthouse_addr = f"http://127.0.0.1:{port}"
        self.lighthouse = AgentProcess(
            [lighthouse_binary() or "torchft_lighthouse", "--min_replicas", "1", "--bind", f"127.0.0.1:{port}",
             *(f"--{key}={variant.conf[key]}" for key in ("join_timeout_ms", "quorum_tick_ms",
                                                           "heartbeat_timeout_ms"))],
            root / "lighthouse.log",
        ).start()
        if not self.wait_for(lambda: _listening(port), LIGHTHOUSE_START_SECONDS):
            self.lighthouse.stop()
            raise RuntimeError(f"torchft_lighthouse did not listen on {port}: {self.lighthouse.output()[-500:]}")

    def command(self) -> list[str]:
        self.replicas += 1
        return [common.PYTHON, str(TWIN), "--replica", str(self.replicas - 1), "--lighthouse", self.lighthouse_addr,
                *self.script_args]

    def live(self) -> list[int]:
        return [i for i, agent in enumerate(self.agents) if agent.returncode is None]

    def crash(self, victim: int) -> float:
        """SIGKILL replica group `victim` and bring its replacement; returns the kill's time (the fault)."""
        if self.variant.conf["spare"]:
            spare = self.ready_spare()
            t = time.time()
            self.agents[victim].kill()
            go_file(spare.log_path).touch()
            self.adopt(spare)
        else:
            t = time.time()
            self.agents[victim].kill()
            self.add()
        self.killed.add(victim)
        return t

    def ready_spare(self) -> AgentProcess:
        """The spare, started now if there is none, once it says it is ready (before the fault: unmeasured)."""
        if self.spare is None or self.spare.returncode is not None:
            command = self.command()
            path = self.root / f"spare{self.replicas - 1}.log"
            self.spare = AgentProcess([*command, "--spare-file", str(go_file(path))], path).start()
        spare = self.spare
        if not self.wait_for(lambda: "spare ready" in spare.output() or spare.returncode is not None,
                             self.spare_timeout) or spare.returncode is not None:
            raise RuntimeError(f"the torchft spare was not ready (exit {spare.returncode}): {spare.output()[-300:]}")
        return spare

    def adopt(self, spare: AgentProcess) -> None:
        self.launched_at.append(time.time())
        self.agents.append(spare)
        self.tails.append(self.tail_type(spare.log_path, len(self.agents) - 1))
        self.spare = None

    def failures(self) -> list[Failure]:
        """A replica that exited without being killed here (torchft logs no failure of its own).

        pid 0: hot.py's `_extra_failures` then counts it whoever it was (a pid there means an old worker whose
        end torch's agents report after a fault, which a torchft survivor is not)."""
        now = time.time()
        for i, agent in enumerate(self.agents):
            if i not in self.killed and i not in self.exits and agent.returncode is not None:
                self.exits[i] = Failure(i, agent.returncode, 0, now)
        return [*super().failures(), *self.exits.values()]

    def stop(self) -> None:
        super().stop()
        for process in (self.spare, self.lighthouse):
            if process is not None:
                with contextlib.suppress(Exception):
                    process.stop()


def go_file(spare_log: Path) -> Path:
    """The file a spare waits for (beside its log)."""
    return spare_log.with_suffix(".go")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
