"""Every rank's random generators in a checkpoint: as plain bytes and ints, so they gather between
ranks and load with ``weights_only``."""

from __future__ import annotations

import random
from typing import Any


def capture() -> dict[str, Any]:
    """This rank's random generators, as plain bytes and ints (safe to gather and to load with weights_only)."""
    import torch

    state: dict[str, Any] = {"torch": torch.get_rng_state().numpy().tobytes(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = [s.cpu().numpy().tobytes() for s in torch.cuda.get_rng_state_all()]
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # the tuple form
        state["numpy"] = (kind, np.asarray(keys, dtype="<u4").tobytes(), int(pos), int(has_gauss), float(cached))
    except ImportError:
        pass
    return state


def bytes_tensor(data: bytes) -> Any:
    import torch

    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def restore(state: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(bytes_tensor(state["torch"]))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([bytes_tensor(s) for s in state["cuda"]])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, np.frombuffer(keys, dtype="<u4").copy(), pos, has_gauss, cached))
