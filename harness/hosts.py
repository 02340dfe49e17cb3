"""Test hosts on one machine: network namespaces joined to one switch, and partitions between them.

Each `Host` is a network namespace with one interface (a veth pair whose other end sits on a bridge in a
namespace of its own, the switch) and one address on a private /24; processes started on a host (`command`)
see only that interface and their own loopback. Nothing is added to the machine's own namespace, so test
traffic stays inside these namespaces, and `close` removes every one of them (deleting a namespace deletes
its end of each veth pair).

Partitions are blackhole routes: `cut(a, b)` makes `a` drop what it sends to `b` and `b` what it sends to
`a`; `cut_one_way(a, b)` only the first (an asymmetric partition: `b`'s packets still reach `a`, `a` can
answer none of them). `heal()` removes them all.

Needs root and `ip` (Debian's iproute2); `unavailable()` says why not, for a test to skip with that reason.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def unavailable() -> str | None:
    """Why test hosts cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` command (install iproute2)"
    probe = f"elx-probe-{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass(frozen=True)
class Host:
    name: str
    namespace: str
    address: str
    interface: str  # inside the namespace (what GLOO_SOCKET_IFNAME names)

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` run on this host (`ip netns exec` execs it: the pid is the command's own)."""
        return ["ip", "netns", "exec", self.namespace, *argv]


class Network:
    """Hosts on one switch; see the module docstring."""

    def __init__(self) -> None:
        self.tag = f"x{random.randrange(16**4):04x}"  # short: interface names are at most 15 characters
        self.subnet = f"10.{random.randrange(100, 250)}.{random.randrange(256)}"
        self.switch = f"{self.tag}-sw"
        self.hosts: list[Host] = []
        self._cuts: list[tuple[Host, Host]] = []
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")

    def add(self, name: str) -> Host:
        index = len(self.hosts) + 1
        host = Host(name, f"{self.tag}-{name}", f"{self.subnet}.{index}", f"{self.tag}h{index}")
        port = f"{self.tag}s{index}"
        _ip("netns", "add", host.namespace)
        _ip("link", "add", host.interface, "type", "veth", "peer", "name", port)
        _ip("link", "set", host.interface, "netns", host.namespace)
        _ip("link", "set", port, "netns", self.switch)
        _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
        _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.interface)
        _ip("-n", host.namespace, "link", "set", host.interface, "up")
        _ip("-n", host.namespace, "link", "set", "lo", "up")
        self.hosts.append(host)
        return host

    def cut_one_way(self, sender: Host, receiver: Host) -> None:
        """`sender` drops everything it sends to `receiver`."""
        _ip("-n", sender.namespace, "route", "add", "blackhole", f"{receiver.address}/32")
        self._cuts.append((sender, receiver))

    def cut(self, a: Host, b: Host) -> None:
        self.cut_one_way(a, b)
        self.cut_one_way(b, a)

    def isolate(self, host: Host) -> None:
        """`host` reaches no other host, and none reaches it."""
        for other in self.hosts:
            if other is not host:
                self.cut(host, other)

    def heal(self) -> None:
        for sender, receiver in self._cuts:
            _ip("-n", sender.namespace, "route", "del", "blackhole", f"{receiver.address}/32", check=False)
        self._cuts.clear()

    def close(self) -> None:
        for namespace in [h.namespace for h in self.hosts] + [self.switch]:
            _ip("netns", "del", namespace, check=False)
        self.hosts.clear()
