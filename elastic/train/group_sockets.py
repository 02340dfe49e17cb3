"""A round's sockets belong to the worker that made them, never to its forked children.

Survivors learn that a peer died when the peer's sockets close: gloo's pending receive fails at once, and
`Session._drop_group` relies on the same to release peers stuck in a collective. A forked child (a DataLoader
worker, a `multiprocessing.Pool`) inherits a copy of every socket of its parent, and while it lives the
connection stays open: with `num_workers=2` in the DDP tutorial, a crashed rank's DataLoader workers kept its
gloo connections up, so the survivor waited in its all-reduce until the hang watchdog gave up on it (exit 86,
a free restart, but the survivor's process, module and optimizer were lost). So a child closes its copies of
the round's sockets as it starts (an at-fork handler), and a worker's sockets close when it does.

The round's sockets are those that appeared while its groups formed (`claimed`). A child never uses them (a
gloo group cannot be shared across processes); anything else that opened a socket in that window (an etcd
connection of another thread) is the parent's too, and a child that closes its copy loses nothing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

_held: set[int] = set()
_installed = False


def socket_fds() -> set[int]:
    """This process's open socket file descriptors."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                found.add(int(name))
    return found


@contextlib.contextmanager
def claimed() -> Iterator[None]:
    """The sockets opened inside are the round's: forked children close their copies."""
    global _installed
    if not _installed:
        os.register_at_fork(after_in_child=_close_in_child)
        _installed = True
    before = socket_fds()
    try:
        yield
    finally:
        _held.update(socket_fds() - before)


def release() -> None:
    """The round's groups are being destroyed: their descriptors may be reused for anything from now on."""
    _held.clear()


def held() -> frozenset[int]:
    return frozenset(_held)


def _close_in_child() -> None:
    for fd in _held:
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()
