"""Real training scripts run in place exactly as under stock torchrun (issue 28).

Each script of this corpus is a small data-parallel training loop that exercises one part of what a
script may expect of its process (worker processes, its own identity, its signal handlers, ...). Each runs
twice on a real etcd, 1 agent x 2 workers, with rank 1 crashing once: under `elastic agent` in restart mode
(torchrun's own agent: every worker restarted) and under `elastic agent --recovery=in-place` (the crashed
worker replaced by a fork of the warm zygote). What the script printed as `result` lines, the files it
wrote and the exit code must be the same.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from elastic.store.server import EtcdServer
from harness.agents import AgentProcess, torchrun_command

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
RESTART = (sys.executable, "-m", "elastic.agent")
IN_PLACE = (*RESTART, "--recovery=in-place")
RESULT = re.compile(r"^result (\S+?)=(.*)$", re.M)
CRASH_AT_STEP = 5
RUN_SECONDS = 150


@dataclass(frozen=True)
class Outcome:
    """What a user sees of one run: the exit code, the script's observations and files, the log."""

    exit_code: int
    results: frozenset[tuple[str, str]]
    files: dict[str, str]
    output: str


def run(etcd: EtcdServer, root: Path, launcher: Sequence[str], script: str | None = None,
        module: str | None = None, args: Sequence[str] = (), env: dict[str, str] | None = None) -> Outcome:
    """One job of one agent with two workers, in `root` as its working directory; rank 1 crashes once."""
    root.mkdir(parents=True)
    (root / "out").mkdir()
    script_args = [*args, "--crash-at-step", str(CRASH_AT_STEP), "--out", "out"]
    run_id = f"compat-{root.parent.name}-{root.name}"[-60:]
    command = torchrun_command(etcd.client_url, run_id, "1:1", script_args,
                               conf={"lease_seconds": 3, "last_call_seconds": 1}, launcher=launcher,
                               nproc_per_node=2, module=module, **({"script": HERE / script} if script else {}))
    agent = AgentProcess(command, root / "agent.log", env={"COMPAT_RUN_ID": run_id, **(env or {})}, cwd=root).start()
    try:
        code = agent.wait(RUN_SECONDS)
    finally:
        agent.stop()
    output = agent.output()
    files = {str(p.relative_to(root / "out")): p.read_text() for p in sorted((root / "out").rglob("*"))
             if p.is_file() and p.name != "crashed" and p.parent.name != "per-process"}
    return Outcome(code, frozenset(RESULT.findall(output)), files, output)


def run_both(etcd: EtcdServer, root: Path, **kwargs: object) -> tuple[Outcome, Outcome]:
    """The same job under restart mode and in place; both crashed once and ended as the script decides."""
    restart = run(etcd, root / "restart", RESTART, **kwargs)
    in_place = run(etcd, root / "in-place", IN_PLACE, **kwargs)
    for outcome in (restart, in_place):
        assert outcome.output.count("crashing rank=1") == 1, outcome.output[-5000:]
    assert "replaced in place" in in_place.output, in_place.output[-5000:]
    return restart, in_place


def assert_same(restart: Outcome, in_place: Outcome) -> None:
    assert in_place.exit_code == restart.exit_code == 0, in_place.output[-6000:]
    assert in_place.results == restart.results, (sorted(in_place.results ^ restart.results), in_place.output[-4000:])
    assert in_place.files == restart.files


def test_a_shuffled_dataloader_with_worker_processes_trains_in_place(etcd_server: EtcdServer, tmp_path: Path) -> None:
    restart, in_place = run_both(etcd_server, tmp_path, script="dataloader_default.py")
    assert_same(restart, in_place)
    assert {key for key, _ in in_place.results} == {"checksum.rank0", "checksum.rank1"}


def test_processes_the_script_starts_work_in_place_and_in_a_replacement(etcd_server: EtcdServer,
                                                                        tmp_path: Path) -> None:
    """Every kind of child process, started while the session's etcd watch runs; the replacement starts them
    all again."""
    restart, in_place = run_both(etcd_server, tmp_path, script="processes.py", args=["--etcd", etcd_server.client_url])
    assert_same(restart, in_place)
    assert {k: v for k, v in in_place.results if not k.startswith("checksum.")} == {
        "spawn_loader": "True", "fork_loader": "True", "pool": "[0, 1, 4, 9, 16, 25]",
        "executor": "[0, 1, 4, 9, 16, 25]", "subprocess": "child", "etcd_from_fork": "here",
    }
    assert "skipping fork() handlers" not in in_place.output


@pytest.mark.parametrize("entry", ["path", "module"])
def test_the_script_sees_itself_and_its_process_as_under_torchrun(entry: str, etcd_server: EtcdServer,
                                                                  tmp_path: Path) -> None:
    """Identity and process handling, as a script path and as `python -m`; rank 1 raises out of a main()
    under torch's @record once (the replacement, or the restarted worker, checks everything again)."""
    where = {"script": "compatpkg/identity.py"} if entry == "path" else {"module": "compatpkg.identity"}
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    restart, in_place = run_both(etcd_server, tmp_path, env={"PYTHONPATH": path}, **where)
    assert_same(restart, in_place)

    results = dict(in_place.results)
    assert results["name"] == "__main__"
    assert results["file"] == str(HERE / "compatpkg" / "identity.py")
    assert results["path0"] == (os.path.relpath(HERE / "compatpkg", tmp_path / "in-place") if entry == "path" else ".")
    assert results["env.rank1"].startswith("RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 GROUP_RANK=0")
    assert {k: v for k, v in results.items() if v in ("True", "False")} == {
        "run_id": "True", "restart_count": "True", "master": "True", "error_file": "True", "parent": "True",
        "handled.SIGTERM": "True", "handled.SIGINT": "True", "faulthandler": "True",
        "faulthandler_dump": "True", "unbuffered": "True",
    }
    assert results["multiprocessing"] == "('MainProcess', None)"
    assert results["root_handlers"] == "0"
    assert in_place.files["error.rank1.txt"] == f"RuntimeError: injected crash at step {CRASH_AT_STEP}\n"
    assert in_place.files["atexit.rank0.txt"] == in_place.files["atexit.rank1.txt"] == "thread joined first: True\n"
    for outcome in (restart, in_place):
        assert "log MainProcess INFO configured by the script" in outcome.output
    for run_dir in ("restart", "in-place"):  # each process's own random state: siblings and replacements
        states = [json.loads(p.read_text()) for p in (tmp_path / run_dir / "out" / "per-process").iterdir()]
        assert len(states) >= 3
        for kind in ("random", "torch", "torch_seed"):
            assert len({s[kind] for s in states}) == len(states), (run_dir, kind, states)


@pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++")), reason="inductor needs a C++ compiler")
def test_torch_compile_trains_in_place_and_in_a_replacement(etcd_server: EtcdServer, tmp_path: Path) -> None:
    # One compile thread: inductor's pool of compile workers costs more than it saves on a tiny model.
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    restart, in_place = run_both(etcd_server, tmp_path, script="compiled.py", env=env)
    assert_same(restart, in_place)
    assert ("compiled_graphs", "True") in in_place.results
