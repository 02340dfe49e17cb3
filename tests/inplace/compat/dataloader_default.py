"""The most common PyTorch input pipeline, written the most common way: a shuffled `DataLoader` with worker
processes of the default multiprocessing context, at the top level of a script with no `__main__` guard
(issue 28: under an in-place agent the default context was the zygote's forkserver, whose new server
imports the main module, so every worker failed at its first batch; torchrun's workers fork theirs)."""

import corpus
from torch.utils.data import DataLoader

args = corpus.parse_args()
dataset = corpus.rank_dataset()
batches = corpus.StepBatches(
    lambda generator: DataLoader(dataset, batch_size=corpus.BATCH, shuffle=True, num_workers=2, generator=generator))
corpus.train(args, batches)
