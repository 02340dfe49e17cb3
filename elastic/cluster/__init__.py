"""Where workers run: a `WorkerSet` starts, stops and lists them and reports how they ended.

The controller's reconcile is the same for every backend; only the WorkerSet differs (local processes
now, Kubernetes pods next).
"""

from elastic.cluster.base import WorkerObservation, WorkerSet

__all__ = ["WorkerObservation", "WorkerSet"]
