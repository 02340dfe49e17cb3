"""The worker's side of in-place recovery: `Session` owns the process group and hands state over.

A DDP script survives in place by importing torch's calls from here instead (`elastic.train.distributed`:
`init_process_group`, `DistributedDataParallel`, `DataLoader`, `DistributedSampler`, `epochs`); a loop
that wants every step in its hands uses the session itself:

    with elastic.train.Session(state_dict, load_state_dict) as session:
        for step in session.steps(total):
            loss = model(batch(step, session.rank, session.world_size)).backward()
            if session.allreduce_gradients(model):
                optimizer.step()
                session.commit()
            optimizer.zero_grad()

Training scripts fork (DataLoader workers, `multiprocessing.Pool`, `subprocess`), so nothing here imports
gRPC: the session follows its job over etcd's HTTP/JSON gateway on plain sockets (`elastic.store.gateway`),
which installs no fork handler and holds no lock across I/O. gRPC's fork support, which this module used to
turn on, left a DataLoader worker waiting forever in gRPC's post-fork handler when a fork met a lock held by
one of gRPC's threads (issue 44; docs/design.md, "Fork safety"). `tests/inplace/test_fork_safety.py` checks
that importing this package and running a session imports no gRPC.
"""

from elastic.train.ddp import DistributedDataParallel
from elastic.train.distributed import current_session, destroy_process_group, epochs, init_process_group, register
from elastic.train.loader import DataLoader, DistributedSampler
from elastic.train.sampler import ElasticSampler
from elastic.train.session import Session

__all__ = ["DataLoader", "DistributedDataParallel", "DistributedSampler", "ElasticSampler", "Session",
           "current_session", "destroy_process_group", "epochs", "init_process_group", "register"]
