"""The worker's side of in-place recovery: `Session` owns the process group and hands state over.

    with elastic.train.Session(state_dict, load_state_dict) as session:
        for step in session.steps(total):
            loss = model(batch(step, session.rank, session.world_size)).backward()
            if session.allreduce_gradients(model):
                optimizer.step()
                session.commit()
            optimizer.zero_grad()
"""

from elastic.train.session import Session

__all__ = ["Session"]
