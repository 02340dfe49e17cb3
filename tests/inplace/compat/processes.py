"""Processes a training script starts, each while the session's etcd watch runs (gRPC threads): DataLoader
workers of the `spawn` and `fork` contexts (persistent, pinned memory), `multiprocessing.Pool`,
`concurrent.futures.ProcessPoolExecutor`, `subprocess.run([sys.executable, ...])`, and a forked child that
opens its own etcd connection. With the `__main__` guard, as the `spawn` context requires."""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

import corpus
from torch.utils.data import DataLoader

from elastic.store import Store


def square(n: int) -> int:
    return n * n


def etcd_answers(endpoint: str) -> str:
    """In a forked child: a new etcd connection works (the parent's gRPC state is not half-copied)."""
    with Store(endpoint, retry_seconds=5) as store:
        store.put("/compat/fork-child", "here")
        return store.get("/compat/fork-child").value.decode()


def label_sum(loader: DataLoader, epochs: int) -> int:
    return sum(int(y.sum()) for _ in range(epochs) for _, y in loader)


def checks(args: argparse.Namespace) -> None:
    dataset = corpus.rank_dataset()
    spawned = DataLoader(dataset, batch_size=corpus.BATCH, num_workers=1, multiprocessing_context="spawn",
                         persistent_workers=True, pin_memory=True)
    corpus.emit("spawn_loader", label_sum(spawned, epochs=2) == 2 * int(dataset.tensors[1].sum()))
    forked = DataLoader(dataset, batch_size=corpus.BATCH, shuffle=True, num_workers=2,
                        multiprocessing_context="fork", persistent_workers=True)
    corpus.emit("fork_loader", label_sum(forked, epochs=2) == 2 * int(dataset.tensors[1].sum()))
    with multiprocessing.Pool(2) as pool:
        corpus.emit("pool", pool.map(square, range(6)))
    with ProcessPoolExecutor(2) as executor:
        corpus.emit("executor", list(executor.map(square, range(6))))
    echoed = subprocess.run([sys.executable, "-c", "import sys; print(sys.argv[1])", "child"],
                            capture_output=True, text=True, check=True)
    corpus.emit("subprocess", echoed.stdout.strip())
    with multiprocessing.get_context("fork").Pool(1) as pool:
        corpus.emit("etcd_from_fork", pool.apply(etcd_answers, (args.etcd,)))


def main() -> None:
    parser = argparse.ArgumentParser(parents=[corpus.arguments()], add_help=False)
    parser.add_argument("--etcd", required=True)
    args = parser.parse_args()
    batches = corpus.StepBatches(corpus.plain_loader(corpus.rank_dataset()))
    corpus.train(args, batches, checks=lambda: checks(args))


if __name__ == "__main__":
    main()
