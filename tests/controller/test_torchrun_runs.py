"""A run started with stock `torchrun --rdzv-backend=etcd-v3` (no ElasticJob) is listed by `elastic status`
and told by `elastic describe` from its rendezvous keys: round, members, budget, last incident. Real etcd,
real torchrun agents."""

from __future__ import annotations

import json
from contextlib import ExitStack

import pytest

from elastic.cli.main import main
from elastic.store import JobKeys, Store
from harness.agents import AgentProcess, torchrun_command, wait_until

pytestmark = pytest.mark.slow

STARTUP = 90


def test_a_torchrun_run_is_shown_by_status_and_describe(etcd_server, tmp_path, capsys) -> None:
    url = etcd_server.client_url
    keys = JobKeys("default", "tiny2")
    args = ["--steps", "100000", "--step-seconds", "0.05", "--checkpoint-every", "5",
            "--checkpoint-dir", str(tmp_path / "ckpt")]  # fmt: skip
    command = torchrun_command(url, "tiny2", "2:2", args, conf={"lease_seconds": 3, "last_call_seconds": 1,
                                                                         "max_restarts": 5})
    with ExitStack() as stack, Store(url) as store:
        agents = [stack.enter_context(AgentProcess(command, tmp_path / f"agent-{i}.log")) for i in range(2)]

        def round_sealed(number: int) -> bool:
            state = json.loads(store.get(keys.round).value) if store.get(keys.round) else {}
            return state.get("round") == number and state.get("sealed", False)

        def training() -> bool:  # rank 0 prints the steps, whichever agent holds it
            return sum(len(agent.steps()) for agent in agents) >= 3

        assert wait_until(lambda: round_sealed(0) and training(), STARTUP), agents[0].output()
        agents[0].kill_worker()
        assert wait_until(lambda: round_sealed(1), STARTUP), agents[0].output() + agents[1].output()

        assert main(["status", "--etcd", url]) == 0
        table = capsys.readouterr().out.splitlines()
        assert table[0].split()[:2] == ["JOB", "PHASE"], table
        row = next(line for line in table if line.startswith("default/tiny2 ")).split()
        assert row[1:8] == ["Running", "2/-", "-", "-", "1", "2", "1/5"], table  # phase .. restarts
        assert main(["status", "-o", "name", "--etcd", url]) == 0
        assert "default/tiny2" in capsys.readouterr().out.split()

        assert main(["describe", "tiny2", "--etcd", url]) == 0
        text = capsys.readouterr().out
        assert "Started By:    torchrun" in text and "Phase:         Running (RoundSealed)" in text, text
        assert "Round:         1 (sealed, world size 2, opened by WorkerFailure" in text, text
        members = text.split("Members:")[1].split("Budget:")[0].splitlines()[2:]  # below the header
        assert sorted(line.split()[1] for line in members) == ["0", "1"], text  # their ranks
        assert "Budget:        1 charged, maxRestarts 5" in text, text
        assert "Last Incident: round 0 ended: WorkerFailure" in text, text

        assert main(["status", "tiny2", "-o", "json", "--etcd", url]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["metadata"]["annotations"]["elastic.dev/started-by"].startswith("torchrun")
        assert shown["status"]["restarts"] == {"used": 1, "max": 5}, shown

        assert main(["logs", "tiny2", "--etcd", url]) == 1
        assert "is a run torchrun started" in capsys.readouterr().err
