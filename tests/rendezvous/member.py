"""One rendezvous member in its own process, driven by lines on stdin (for handler-level tests).

Usage: python member.py ENDPOINT RUN_ID MIN:MAX key=value,...
Joins at once; then each `next` line on stdin calls `next_rendezvous()` again (what torch's agent does
when its workers failed); `leave` calls `shutdown()`. After every join it prints one line:
`joined <rank> <world_size>`. SIGKILL it to lose a node.
"""

from __future__ import annotations

import sys

from torch.distributed.elastic.rendezvous import RendezvousParameters

from elastic.rendezvous.plugin import create_handler


def main() -> None:
    endpoint, run_id, nnodes, conf_text = sys.argv[1:5]
    low, high = (int(n) for n in nnodes.split(":"))
    conf = dict(pair.split("=", 1) for pair in conf_text.split(",") if pair)
    params = RendezvousParameters("etcd-v3", endpoint, run_id, low, high, local_addr="127.0.0.1", **conf)
    handler = create_handler(params)
    command = "next"
    while command == "next":
        info = handler.next_rendezvous()
        print(f"joined {info.rank} {info.world_size}", flush=True)
        command = sys.stdin.readline().strip()
    handler.shutdown()


if __name__ == "__main__":
    main()
