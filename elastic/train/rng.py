"""The random number generators' states, as part of the job's state (`Session(rng=True)`, the default).

A replacement that takes the model from a peer but starts its generators from the script's seed draws
different dropout masks, augmentations and shuffles than the rank it replaces: it trains differently. The
states travel in the same dict as the model, in types `torch.load(weights_only=True)` reads (tensors,
ints, floats, tuples, dicts): NumPy's state is turned into a tensor and back.
"""

from __future__ import annotations

import random
import sys
from typing import Any

import torch


def rng_states() -> dict[str, Any]:
    """torch's CPU generator, CUDA's where CUDA is initialised, Python's `random`, NumPy's global generator
    where the script imported NumPy (never imported here for it)."""
    states: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kind, keys, pos, has_gauss, cached = numpy.random.get_state()
        states["numpy"] = {"kind": kind, "keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos),
                           "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Take a peer's states; a generator this process lacks (no CUDA, no NumPy, another GPU count) keeps its own."""
    # A copy of its own: a received state is a view into the handover's buffer, and torch 2.13's
    # set_rng_state reads a view with a storage offset wrongly (a segmentation fault here).
    torch.set_rng_state(states["torch"].clone())
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    cuda = states.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([state.clone() for state in cuda])
    numpy = sys.modules.get("numpy")
    saved = states.get("numpy")
    if numpy is not None and saved is not None:
        keys = saved["keys"].numpy().astype("uint32")
        numpy.random.set_state((saved["kind"], keys, saved["pos"], saved["has_gauss"], saved["cached_gaussian"]))
