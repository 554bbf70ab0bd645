"""The rollout engines' one small interface, and which engine a run gets.

`generate(prompts, params)` takes token-id lists and returns, prompt-major, `params.num_samples`
completions per prompt (token ids, ending with EOS when the model stopped) and, when sampling, each
sampled token's log-prob under the engine's own weights; `update_weights` loads the actor's latest
weights in memory. `hf` (transformers generate, rollout/hf.py) runs anywhere; a `vllm` engine
implements the same two methods on GPU.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class SamplingParams:
    max_new_tokens: int
    num_samples: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False


@dataclass
class Completions:
    """Prompt-major: `num_samples` completions per prompt."""

    token_ids: list[list[int]]
    # per sampled token, log softmax(logits / temperature) before top-k / top-p, the quantity the actor
    # computes; None for greedy decoding
    log_probs: list[list[float]] | None = None
    # the version of the actor's weights the engine sampled with (set by the rollout worker: the
    # step whose update it had loaded last; 0 = the weights before RL)
    weight_version: int = -1


class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Completions: ...

    def update_weights(self, state_dict: dict[str, torch.Tensor]) -> None: ...


def choose_engine(requested: str) -> tuple[str, str]:
    """(engine, why): the engine that will run and the reason, logged by the rollout worker. Raises,
    naming what is missing, when the requested engine cannot run in this process."""
    if requested == "hf":
        return "hf", "rollout.engine=hf"
    if requested == "vllm":
        from roll_lite.rollout.vllm_engine import VLLM_VERSION, installed_vllm_version

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
