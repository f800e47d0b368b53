"""Training checkpoints: one file written atomically, read back with `weights_only=True`."""
from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gnndist.errors import GnndistError
from gnndist.io import atomic_file

FILENAME = "checkpoint.pt"
FORMAT = 1


def rng_state() -> dict[str, Any]:
    """The torch, numpy and Python global RNG states, as tensors and plain values."""
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    version, py_state, py_gauss = random.getstate()
    return {"torch": torch.get_rng_state(),
            "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "gauss": float(gauss)},
            "python": {"version": version, "state": list(py_state), "gauss": py_gauss}}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))


def save(directory: str | os.PathLike, payload: dict[str, Any]) -> Path:
    """Write `payload` (tensors, numbers, strings, lists, dicts) as DIR/checkpoint.pt, atomically."""
    path = Path(directory) / FILENAME
    with atomic_file(path) as f:
        torch.save({"format": FORMAT, **payload}, f)
    return path


def load(directory: str | os.PathLike) -> dict[str, Any]:
    """The payload saved in DIR; a missing or unreadable checkpoint is a `GnndistError`."""
    path = Path(directory) / FILENAME
    if not path.is_file():
        raise GnndistError(f"no checkpoint to resume from at {path}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, foreign or pickled-object files
        raise GnndistError(f"cannot read checkpoint {path}: {str(e).strip().splitlines()[0]}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise GnndistError(f"{path} is not a gnndist checkpoint (format {FORMAT})")
    return payload
