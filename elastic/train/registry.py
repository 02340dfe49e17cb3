"""What a worker's job state is: the objects registered with its session, its callables and the RNG states.

A replacement or newcomer receives it from a live peer and a checkpoint keeps it (`Session.state_dict()`):

- named objects with `state_dict()`/`load_state_dict()` (model, optimizer, LR scheduler, gradient scaler, an
  `ElasticSampler`, ...) or tensors (counters; loaded in place);
- `state_dict()` / `load_state_dict(d)`: callables for anything else (a dict of tensors and plain values);
- the random generators' states (`rng`): torch, CUDA where initialised, Python's `random`, NumPy's global
  one where imported, so a replacement draws what the rank it got the state from would have drawn.

What a peer sent for a name not registered yet (a drop-in script registers its optimizer at its first step)
is kept and loaded when that name is registered: the order in which a script builds its objects never matters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from elastic.train.rng import rng_states, set_rng_states
from elastic.train.sampler import ElasticSampler


class StateRegistry:
    def __init__(self, state_dict: Callable[[], dict[str, Any]] | None,
                 load_state_dict: Callable[[dict[str, Any]], None] | None,
                 state: Mapping[str, Any] | None, rng: bool) -> None:
        if (state_dict is None) != (load_state_dict is None):
            raise TypeError("Session: state_dict and load_state_dict go together (one saves what the other loads)")
        self._state_dict = state_dict
        self._load_state_dict = load_state_dict
        self._objects: dict[str, Any] = {}
        self._unclaimed: dict[str, Any] = {}
        self._rng = rng
        for name, obj in (state or {}).items():
            self.register(name, obj)

    def register(self, name: str, obj: Any) -> None:
        """Add `obj` under `name`; it takes what a peer sent under that name, if anything."""
        stateful = hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")
        if not (isinstance(obj, torch.Tensor) or stateful):
            raise TypeError(f"Session: state[{name!r}] is a {type(obj).__name__}, which has no state_dict() and "
                            "load_state_dict(): register a model, optimizer, scheduler, sampler or tensor, or "
                            "pass it through the state_dict/load_state_dict callables")
        self._objects[name] = obj
        if name in self._unclaimed:
            _load_object(obj, self._unclaimed.pop(name))

    def registered(self, name: str) -> Any | None:
        return self._objects.get(name)

    def samplers(self) -> list[ElasticSampler]:
        """The registered samplers: each advances with every committed step."""
        return [obj for obj in self._objects.values() if isinstance(obj, ElasticSampler)]

    def state_dict(self, step: int) -> dict[str, Any]:
        """The state at committed step `step`: every registered object, the callables' dict, the RNG states."""
        saved: dict[str, Any] = {"step": step}
        if self._objects:
            saved["objects"] = {name: obj if isinstance(obj, torch.Tensor) else obj.state_dict()
                                for name, obj in self._objects.items()}
        if self._state_dict is not None:
            saved["state"] = self._state_dict()
        if self._rng:
            saved["rng"] = rng_states()
        return saved

    def load_state_dict(self, saved: dict[str, Any]) -> int:
        """Load what `state_dict()` gave (a peer's or a checkpoint's); its committed step."""
        objects = saved.get("objects", {})
        missing = sorted(set(self._objects) - set(objects))
        if missing:
            raise KeyError(f"Session: the saved state has no {', '.join(missing)} (it has: "
                           f"{', '.join(sorted(objects)) or 'no registered objects'}); register the same names "
                           "as the run that saved it")
        for name, obj in self._objects.items():
            _load_object(obj, objects[name])
        self._unclaimed = {name: value for name, value in objects.items() if name not in self._objects}
        if self._load_state_dict is not None:
            self._load_state_dict(saved["state"])
        if self._rng and "rng" in saved:
            set_rng_states(saved["rng"])
        return int(saved["step"])


def _load_object(obj: Any, saved: Any) -> None:
    if isinstance(obj, torch.Tensor):
        obj.copy_(saved)
    else:
        obj.load_state_dict(saved)
