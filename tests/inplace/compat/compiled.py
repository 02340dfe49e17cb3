"""`torch.compile` (inductor, which builds C++ for the CPU) in the training loop: each process compiles,
the replacement too."""

from __future__ import annotations

import corpus
import torch
import torch._dynamo.utils


def main() -> None:
    args = corpus.parse_args()
    corpus.train(args, corpus.StepBatches(corpus.plain_loader(corpus.rank_dataset())), forward=torch.compile)
    corpus.emit("compiled_graphs", torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0)


if __name__ == "__main__":
    main()
