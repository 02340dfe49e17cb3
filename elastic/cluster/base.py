"""The contract between the controller and a place that runs workers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from elastic.errors import PermanentError


class WorkerStartError(PermanentError):
    """A worker could not be started (the operating system refused: a missing working directory, a full
    process table, an unwritable log directory, ...). The message names the worker and the OS error; the
    controller fails that job with it instead of letting it out of the controller."""


@dataclass(frozen=True)
class WorkerObservation:
    """One worker (one agent with its `nprocPerNode` training processes) as last seen."""

    name: str
    alive: bool
    exit_code: int | None = None  # None while alive, or when the end was not observed (adopted, node lost)
    reason: str | None = None  # platform reason: OOMKilled, Evicted, NodeLost, ...
    started_at: float = 0.0
    stopping: bool = False  # the controller asked it to stop
    ready: bool = True  # alive and serving (a pod whose Ready condition is True; a local process once started)
    waiting: str | None = None  # why an alive worker is not running yet (ImagePullBackOff, Unschedulable, ...)
    # Alive but not started yet: a Pending pod (unscheduled, init containers, image pull). A pod that ran and
    # then lost readiness (its node went NotReady) is not pending: that is a loss, not a slow start.
    pending: bool = False


@dataclass(frozen=True)
class WorkerLaunch:
    """Everything needed to start one worker, decided by the controller, run by the WorkerSet."""

    name: str
    command: list[str]
    env: dict[str, str]
    working_dir: str | None = None


class WorkerSet(Protocol):
    def start(self, launch: WorkerLaunch) -> None:
        """Start one worker; WorkerStartError when it cannot be started."""
        ...

    def stop(self, name: str) -> None: ...

    def observe(self) -> list[WorkerObservation]: ...

    def forget(self, name: str) -> None:
        """Drop an ended worker's record once its end was handled."""
        ...

    def close(self) -> None: ...
