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
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from elastic.store import JobKeys
from harness.agents import AgentProcess, torchrun_command, wait_until
from harness.etcd_cluster import EtcdCluster
from harness.hosts import Host, Network, unavailable

CANNOT = unavailable()  # why test hosts cannot be made here (None: they can); probed once
pytestmark = [pytest.mark.slow, pytest.mark.skipif(CANNOT is not None, reason=str(CANNOT))]

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


def agent_on(host: Host, cluster: EtcdCluster, run_id: str, script_args: list[str], log: Path,
             conf: dict[str, object] | None = None) -> AgentProcess:
    command = torchrun_command(cluster.endpoints, run_id, "1:2", script_args, conf=conf, launcher=IN_PLACE,
                               script=SCRIPT, local_addr=host.address)
    # gloo binds where the host's address is (the machine's hostname resolves outside the namespace)
    return AgentProcess(host.command(command), log, env={"GLOO_SOCKET_IFNAME": host.interface}).start()


@dataclass
class JobAcrossHosts:
    """2 in-place agents on hosts a0 and a1, a 3-member etcd cluster on hosts e0, e1 and e2."""

    network: Network
    root: Path
    run_id: str
    conf: dict[str, object] | None = None
    total: int = 400
    cluster: EtcdCluster = field(init=False)
    agents: list[AgentProcess] = field(default_factory=list)

    def __enter__(self) -> JobAcrossHosts:
        self.members = [self.network.add(f"e{i}") for i in range(3)]
        self.nodes = [self.network.add(f"a{i}") for i in range(2)]
        self.cluster = EtcdCluster(self.members, self.root).start()
        args = ["--steps", str(self.total), "--step-seconds", "0.05", "--hidden", "32"]
        self.agents = [agent_on(h, self.cluster, self.run_id, args, self.root / f"{h.name}.log", self.conf)
                       for h in self.nodes]
        return self

    def __exit__(self, *exc: object) -> None:
        for agent in self.agents:
            agent.stop()
        self.cluster.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {a.log_path.name}\n{a.output()[-3000:]}" for a in self.agents)

    def steps(self) -> list[tuple[int, int]]:
        return steps(self.agents)

    def finish(self) -> None:
        """Every agent exits 0, every step committed once (one round trains at a time)."""
        assert wait_until(lambda: all(a.returncode is not None for a in self.agents), 180), self.logs()
        assert [a.returncode for a in self.agents] == [0, 0], self.logs()
        committed = sorted(step for step, _ in self.steps())
        assert committed == list(range(self.total)), "every step committed once\n" + self.logs()
        done = DONE.findall("\n".join(a.output() for a in self.agents))
        assert [d[0] for d in done] == [str(self.total)] * 2, self.logs()


def steps(agents: list[AgentProcess]) -> list[tuple[int, int]]:
    return [(int(m[1]), int(m[2])) for a in agents for m in STEP.finditer(a.output())]


def budget(cluster: EtcdCluster, run_id: str) -> str:
    """The job's budget record, read on a member's host (the test's own namespace reaches no test host)."""
    return subprocess.run(
        cluster.hosts[0].command([str(cluster.binary.parent / "etcdctl"), f"--endpoints={cluster.endpoints}",
                                  "get", "--print-value-only", JobKeys.parse(f"default/{run_id}").budget]),
        capture_output=True, text=True, timeout=30, env={**os.environ, "ETCDCTL_API": "3"}).stdout


def test_an_in_place_job_across_hosts_trains_on_while_the_etcd_leader_is_cut_off_from_its_quorum(
        network: Network, tmp_path: Path) -> None:
    with JobAcrossHosts(network, tmp_path, "across-hosts") as job:
        assert wait_until(lambda: any(world == 2 and step >= 20 for step, world in job.steps()), 120), job.logs()
        leader = job.cluster.leader()
        assert leader is not None
        network.isolate(leader)  # the leader reaches no member, no agent, no worker; none reaches it
        cut_at = max(step for step, _ in job.steps())
        assert wait_until(lambda: any(step >= cut_at + 40 for step, _ in job.steps()), 90), \
            "training went on while the leader was cut off\n" + job.logs()
        network.heal()
        job.finish()
        assert {world for _, world in job.steps()} == {2}, "no round ended: the etcd leader's loss is free"
        record = budget(job.cluster, job.run_id)
        assert '"charges": []' in record or '"charges":[]' in record, record


def test_an_agent_cut_off_from_etcd_but_not_from_its_peer_is_one_lost_member_and_comes_back(
        network: Network, tmp_path: Path) -> None:
    with JobAcrossHosts(network, tmp_path, "cut-from-etcd", {"lease_seconds": 3, "last_call_seconds": 1},
                        total=500) as job:
        assert wait_until(lambda: any(world == 2 and step >= 20 for step, world in job.steps()), 120), job.logs()
        cut = job.nodes[1]  # rank 0 prints the steps; which agent holds it does not matter to the rules
        for member in job.members:
            network.cut(cut, member)  # its peer stays reachable: gloo goes on until the survivor leaves
        assert wait_until(lambda: any(world == 1 for _, world in job.steps()), 60), \
            "the survivor trained alone once the cut agent's lease expired\n" + job.logs()
        network.heal()
        back = max(step for step, _ in job.steps())
        assert wait_until(lambda: any(world == 2 and step > back for step, world in job.steps()), 90), \
            "the cut agent came back and the job grew to 2 again\n" + job.logs()
        job.finish()
        record = budget(job.cluster, job.run_id)
        assert record.count('"reason"') == 1 and "MemberLost" in record, record
