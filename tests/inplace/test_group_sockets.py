"""A round's sockets do not outlive their worker in its forked children (elastic.train.group_sockets): a
child closes its copies as it starts, so a peer sees the connection close when the worker dies even while
its DataLoader workers live. (The story it serves, a crash under `num_workers=2`, is in test_ddp_dropin.py.)"""

from __future__ import annotations

import os
import socket

from elastic.train import group_sockets


def test_a_forked_child_closes_the_rounds_sockets_and_the_parent_keeps_them() -> None:
    unrelated = socket.socket()
    with group_sockets.claimed():
        mine, peer = socket.socketpair()
    try:
        assert group_sockets.held() == {mine.fileno(), peer.fileno()}, "only what opened inside is the round's"
        child = os.fork()
        if child == 0:  # the child: report which of the parent's sockets it still holds, and leave
            still = group_sockets.socket_fds() & {mine.fileno(), peer.fileno(), unrelated.fileno()}
            os._exit(0 if still == {unrelated.fileno()} else 1)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child closed the round's sockets and kept the others"
        mine.sendall(b"x")
        assert peer.recv(1) == b"x", "the parent's own sockets work on"
        group_sockets.release()
        assert group_sockets.held() == frozenset()
    finally:
        for s in (mine, peer, unrelated):
            s.close()
