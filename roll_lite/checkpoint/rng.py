"""The random number generators of one process: Python's, NumPy's and torch's (CPU, and CUDA when present)."""

from __future__ import annotations

import pickle
import random
from pathlib import Path

import numpy as np
import torch


def capture_rng() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_rng(path: Path, extra: dict | None = None) -> None:
    """This process's generators (and `extra`, e.g. a torch.Generator's state) in one pickle."""
    with open(path, "wb") as f:
        pickle.dump({**capture_rng(), **(extra or {})}, f)


def load_rng(path: Path) -> dict:
    """Restore the generators saved by save_rng; returns the whole saved dict (with the extras)."""
    with open(path, "rb") as f:
        state = pickle.load(f)
    restore_rng(state)
    return state
