"""Faults across hosts (issue 41): agents and a 3-member etcd cluster on test hosts of their own (network
namespaces on one switch, `harness.hosts`), the workers' gloo traffic between hosts, and partitions.

Real etcd (3 members, one per host), real `elastic agent --recovery=in-place` agents, real gloo between the
agents' hosts. Skipped, with the reason, where network namespaces cannot be made (not root, no iproute2).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastic.store import JobKeys
from harness.agents import AgentProcess, torchrun_command, wait_until
from harness.etcd_cluster import EtcdCluster
from harness.hosts import Host, Network, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_inplace.py"
IN_PLACE = (sys.executable, "-m", "elastic.agent", "--recovery=in-place")
STEP = re.compile(r"^step=(\d+) loss=\S+ world_size=(\d+) restart=(\d+) time=\S+$", re.M)
DONE = re.compile(r"^done step=(\d+) applied=(\d+) checksum=(\S+) pid=\d+$", re.M)


@pytest.fixture
def network() -> Iterator[Network]:
    made = Network()
    yield made
    made.close()


def agent_on(host: Host, cluster: EtcdCluster, run_id: str, script_args: list[str], log: Path) -> AgentProcess:
    command = torchrun_command(cluster.endpoints, run_id, "1:2", script_args, launcher=IN_PLACE, script=SCRIPT,
                               local_addr=host.address)
    # gloo binds where the host's address is (the machine's hostname resolves outside the namespace)
    return AgentProcess(host.command(command), log, env={"GLOO_SOCKET_IFNAME": host.interface}).start()


def steps(agents: list[AgentProcess]) -> list[tuple[int, int]]:
    return [(int(m[1]), int(m[2])) for a in agents for m in STEP.finditer(a.output())]


def test_an_in_place_job_across_hosts_trains_on_while_the_etcd_leader_is_cut_off_from_its_quorum(
        network: Network, tmp_path: Path) -> None:
    members = [network.add(f"e{i}") for i in range(3)]
    nodes = [network.add(f"a{i}") for i in range(2)]
    cluster = EtcdCluster(members, tmp_path).start()
    run_id, total = "across-hosts", 400
    args = ["--steps", str(total), "--step-seconds", "0.05", "--hidden", "32"]
    agents = [agent_on(h, cluster, run_id, args, tmp_path / f"{h.name}.log") for h in nodes]
    logs = lambda: "\n".join(f"--- {a.log_path.name}\n{a.output()[-3000:]}" for a in agents)  # noqa: E731
    try:
        assert wait_until(lambda: any(world == 2 and step >= 20 for step, world in steps(agents)), 120), logs()
        leader = cluster.leader()
        assert leader is not None
        network.isolate(leader)  # the leader reaches no member, no agent, no worker; none reaches it
        cut_at = max(step for step, _ in steps(agents))
        assert wait_until(lambda: any(step >= cut_at + 40 for step, _ in steps(agents)), 90), \
            "training went on while the leader was cut off\n" + logs()
        network.heal()
        assert wait_until(lambda: all(a.returncode is not None for a in agents), 180), logs()
        assert [a.returncode for a in agents] == [0, 0], logs()
        done = DONE.findall("\n".join(a.output() for a in agents))
        assert len(done) == 2 and done[0][0] == done[1][0] == str(total), logs()
        assert {world for _, world in steps(agents)} == {2}, "no round ended: the etcd leader's loss is free"
        budget = subprocess.run(
            members[0].command([str(cluster.binary.parent / "etcdctl"), f"--endpoints={cluster.endpoints}",
                                "get", "--print-value-only", JobKeys.parse(f"default/{run_id}").budget]),
            capture_output=True, text=True, timeout=30, env={**os.environ, "ETCDCTL_API": "3"}).stdout
        assert '"charges": []' in budget or '"charges":[]' in budget, budget
    finally:
        for agent in agents:
            agent.stop()
        cluster.stop()
