"""Whom a round opened by a failure waits for: the members heard from during the incident, nobody else.

Each member is a real `EtcdV3RendezvousHandler` in its own process (tests/rendezvous/member.py) on a real
etcd; no training, so each story takes seconds. The last call (120 s) and the member lease (60 s) are far
longer than the deadlines below: a recovery within the deadline proves that neither was waited out.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from elastic.store import JobKeys, Store
from elastic.store.server import EtcdServer
from harness.agents import round_record

CONF = "last_call_seconds=120,lease_seconds=60,settle_seconds=1,max_restarts=5"
START = 60  # seconds for a member process to import torch and join, on a busy machine
RECOVERY = 30  # far below the last call and the lease


class Member:
    """A member process: `next()` is its agent's next_rendezvous() after a worker failure."""

    def __init__(self, etcd: EtcdServer, run_id: str, nnodes: str, log: Path) -> None:
        script = Path(__file__).with_name("member.py")
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), etcd.client_url, run_id, nnodes, CONF],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    @property
    def id_prefix(self) -> str:
        return f"{socket.gethostname()}-{self.proc.pid}-"

    def joined(self, timeout: float) -> tuple[int, int]:
        """(rank, world size) of its next join; fails the test if it does not join in time."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"member {self.proc.pid} did not join within {timeout:g} s")
        _, rank, world = line.split()
        return int(rank), int(world)

    def next(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("next\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._log.close()


@pytest.fixture
def members(etcd_server: EtcdServer, tmp_path: Path, request: pytest.FixtureRequest):
    run_id = request.node.name.replace("_", "-")[:40]
    made: list[Member] = []
    store = Store(etcd_server.client_url)
    keys = JobKeys.parse(f"default/{run_id}")

    def start(count: int) -> list[Member]:
        """`count` members of a job with max `count` nodes: the first round seals at max, with no last call."""
        made.extend(Member(etcd_server, run_id, f"1:{count}", tmp_path / f"member{i}.log") for i in range(count))
        for member in made:
            assert member.joined(START)[1] == count
        return made

    yield start, store, keys
    for member in made:
        member.stop()
    store.close()


def _id_of(member: Member, round_record: dict[str, Any]) -> str:
    return next(m for m in round_record["members"] if m.startswith(member.id_prefix))


def test_a_lost_node_is_not_waited_for(members) -> None:
    start, store, keys = members
    survivor, lost = start(2)
    lost_id = _id_of(lost, round_record(store, keys))
    lost.stop()  # SIGKILL: its lease (60 s) keeps its member key alive long after the recovery below
    survivor.next()
    assert survivor.joined(RECOVERY) == (0, 1)
    following = round_record(store, keys)
    # The survivor reported nothing known (stock torchrun) and the lost member stayed silent: the round ends
    # as the silent member's loss, charged to it, never to the survivor (docs/design.md §3.16; this said
    # WorkerFailure, of the survivor, before the incident module).
    assert following["round"] == 1 and following["opened_by"] == "MemberLost"
    assert list(following["members"]) == [_id_of(survivor, following)], "only the member heard from is in it"
    assert store.get(keys.member(lost_id)) is not None, "the lost member's lease had not run out"
    budget = store.get_json(keys.budget)
    assert budget["used"] == 1 and budget["charges"][0]["member"] == lost_id, budget


def test_a_member_that_answered_the_incident_is_counted_in_and_nobody_else(members) -> None:
    start, store, keys = members
    failed, peer, lost = start(3)
    first = round_record(store, keys)
    lost.stop()
    failed.next()  # its workers failed; the peer's agent has not noticed anything yet (its workers still run)
    peer.next()  # its agent re-joins (torch saw num_nodes_waiting() > 0)
    # The peer answered the failure report, so it is expected back and counted in as its key stands; the lost
    # member stayed silent (its key lives on for its 60 s lease) and is neither waited for nor taken in: 2 of
    # max 3, sealed at once (without knowing who is expected this would wait out the 120 s last call).
    assert {failed.joined(RECOVERY), peer.joined(RECOVERY)} == {(0, 2), (1, 2)}
    sealed = round_record(store, keys)
    assert sealed["round"] == 1 and sealed["sealed"]
    assert set(sealed["members"]) == {_id_of(failed, first), _id_of(peer, first)}, "the lost member is not in it"
    assert store.get_json(keys.budget)["used"] == 1
