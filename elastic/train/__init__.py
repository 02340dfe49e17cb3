"""The worker's side of in-place recovery: `Session` owns the process group and hands state over.

    with elastic.train.Session(state_dict, load_state_dict) as session:
        for step in session.steps(total):
            loss = model(batch(step, session.rank, session.world_size)).backward()
            if session.allreduce_gradients(model):
                optimizer.step()
                session.commit()
            optimizer.zero_grad()

A session keeps an etcd watch (gRPC threads) in the training process, and training scripts fork
(DataLoader workers, `multiprocessing.Pool`, ...). gRPC makes a fork safe only with its fork support on:
its threads pause at a safe point for the fork, and the child gets the parent's channels closed instead of
half-copied ones that abort when touched. It is read once, when gRPC is first imported, so it is set here,
before anything below imports gRPC (unless the user set it: theirs is kept).
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "true")

from elastic.train.sampler import ElasticSampler
from elastic.train.session import Session

__all__ = ["ElasticSampler", "Session"]
