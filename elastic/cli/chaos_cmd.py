"""`elastic chaos kill`: fault injection for demos and tests (local workers)."""

from __future__ import annotations

import argparse
import os
import signal

from elastic.cli.common import add_etcd_option, connect, whole_number
from elastic.cluster.processes import descendants_of, is_worker, training_processes
from elastic.codec import decode_worker
from elastic.errors import PermanentError
from elastic.store import JobKeys


def register(verbs: argparse._SubParsersAction) -> None:
    chaos = verbs.add_parser("chaos", help="inject faults into a running job (demos, tests)")
    faults = chaos.add_subparsers(dest="fault", metavar="FAULT", required=True)
    kill = faults.add_parser("kill", help="kill a worker's agent (a node loss) or one training process")
    kill.add_argument("job", help="namespace/name or name")
    kill.add_argument("--worker", help="worker name (default: the first one)")
    kill.add_argument("--training", action="store_true", help="kill one training process, not the agent")
    kill.add_argument("--signal", type=signal_number, default=int(signal.SIGKILL), metavar="SIG",
                      help="a number or a name: 9, KILL, SIGKILL, TERM, ... (default: KILL)")
    add_etcd_option(kill)
    kill.set_defaults(run=kill_cmd)


def signal_number(text: str) -> int:
    """An argparse type: a signal by number or by name, as `kill -s` takes it (TERM, SIGTERM, term, 15)."""
    if text.strip().lstrip("+-").isdigit():
        return whole_number(1, max(signal.valid_signals()))(text)
    name = text.strip().upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    try:
        return int(signal.Signals[name])
    except KeyError:
        raise argparse.ArgumentTypeError(f"{text[:20]!r} is not a signal: give a number or a name such as "
                                         "KILL, TERM, INT") from None


def kill_cmd(args: argparse.Namespace) -> int:
    keys = JobKeys.parse(args.job)
    with connect(args) as store:
        entries, _ = store.get_prefix(keys.workers_prefix)
    workers = {e.key[len(keys.workers_prefix) :]: decode_worker(e.key, e.value).pid for e in entries}
    if not workers:
        raise PermanentError(f"job {keys.namespace}/{keys.name} has no local workers to kill")
    name = args.worker or sorted(workers)[0]
    if name not in workers:
        raise PermanentError(f"no worker {name!r}; workers: {', '.join(sorted(workers))}")
    pid = workers[name]
    if not is_worker(pid, name):  # the agent ended and its pid may belong to an unrelated process by now
        raise PermanentError(
            f"worker {name}: pid {pid} is not that worker's agent on this machine (it has exited, or runs "
            "elsewhere); nothing was signalled. 'elastic status' shows the job's live workers"
        )
    targets = training_processes(pid)[:1] if args.training else [pid]
    if not targets:
        raise PermanentError(f"worker {name} has no training process right now")
    if not args.training:
        targets += descendants_of(pid)  # with its training processes, as a node loss would
    for target in targets:
        os.kill(target, args.signal)
    what = "training process" if args.training else "agent"
    print(f"sent signal {_name(args.signal)} to the {what} of {name} (pid {targets[0]})")


def _name(number: int) -> str:
    try:
        return f"{number} ({signal.Signals(number).name})"
    except ValueError:  # a real-time signal has no name of its own
        return str(number)
    return 0
