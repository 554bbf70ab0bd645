"""Which rollout engine a run gets, and why (logged by the rollout worker)."""

from __future__ import annotations

import importlib.util

import torch

from roll_lite.rollout.vllm_engine import VLLM_VERSION, installed_vllm_version


def choose_engine(requested: str) -> tuple[str, str]:
    """(engine, why): the engine that will run and the reason, logged by the rollout worker. Raises,
    naming what is missing, when the requested engine cannot run in this process."""
    if requested == "hf":
        return "hf", "rollout.engine=hf"
    if requested == "vllm":
        if not torch.cuda.is_available():
            raise RuntimeError("rollout.engine=vllm needs a CUDA GPU; use rollout.engine=hf on CPU")
        if importlib.util.find_spec("vllm") is None:
            raise RuntimeError(f"rollout.engine=vllm needs vllm: pip install -e '.[gpu]' (vllm {VLLM_VERSION}, torch 2.13)")
        installed = installed_vllm_version()
        why = "rollout.engine=vllm"
        if installed != VLLM_VERSION:
            why += f"; vllm {installed} is installed, roll_lite is written against {VLLM_VERSION}"
        return "vllm", why
    raise ValueError(f"unknown rollout engine '{requested}'; choose hf or vllm")
