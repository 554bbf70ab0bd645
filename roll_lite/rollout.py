"""Rollout engines behind one small interface.

`generate(prompts, params)` takes token-id lists and returns, prompt-major, `params.num_samples`
completions per prompt (token ids, ending with EOS when the model stopped); `update_weights` loads
the actor's latest weights in memory. `hf` (transformers generate) runs anywhere; a `vllm` engine
implements the same two methods on GPU.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

logger = logging.getLogger(__name__)


@dataclass
class SamplingParams:
    max_new_tokens: int
    num_samples: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False


class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]: ...

    def update_weights(self, state_dict: dict[str, torch.Tensor]) -> None: ...


class HFEngine:
    """transformers `generate`, batched over all prompts × samples, left-padded."""

    def __init__(self, model: nn.Module, pad_token_id: int, eos_token_id: int, seed: int = 0):
        self.model = model.eval()
        self.model.set_attn_implementation("sdpa")
        self.pad_token_id, self.eos_token_id = pad_token_id, eos_token_id
        self.device = next(model.parameters()).device
        self.generator_seed = seed
        self.calls = 0

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("generate: every prompt needs at least one token")
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for i, prompt in enumerate(prompts):
            input_ids[i, width - len(prompt):] = torch.tensor(prompt)
            attention_mask[i, width - len(prompt):] = 1
        options = dict(max_new_tokens=params.max_new_tokens, pad_token_id=self.pad_token_id, eos_token_id=self.eos_token_id)
        if params.greedy:
            if params.num_samples != 1:
                raise ValueError("greedy decoding gives one completion per prompt; set num_samples=1")
            options.update(do_sample=False, num_return_sequences=1)
        else:
            # top_k=0 turns top-k off (transformers' default would be 50)
            options.update(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                           num_return_sequences=params.num_samples)
        torch.manual_seed(self.generator_seed + self.calls)  # reproducible, different every call
        self.calls += 1
        output = self.model.generate(
            input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device), **options
        )
        completions = []
        for row in output[:, width:].tolist():
            if self.eos_token_id in row:
                row = row[: row.index(self.eos_token_id) + 1]
            else:
                row = [t for t in row if t != self.pad_token_id]
            completions.append(row)
        return completions

    def state_dict(self) -> dict:
        """Where sampling stands: every generate call reseeds torch with (seed + calls so far)."""
        return {"seed": self.generator_seed, "calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.generator_seed, self.calls = int(state["seed"]), int(state["calls"])

    def update_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
        if set(missing) - tied or unexpected:
            raise KeyError(f"rollout weight sync: missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}")


def choose_engine(requested: str) -> tuple[str, str]:
    """(engine, why): the engine that will run and the reason, logged by the rollout worker."""
    if requested == "hf":
        return "hf", "rollout.engine=hf"
    if requested == "vllm":
        if not torch.cuda.is_available():
            raise RuntimeError("rollout.engine=vllm needs a CUDA GPU; use rollout.engine=hf on CPU")
        if importlib.util.find_spec("vllm") is None:
            raise RuntimeError("rollout.engine=vllm needs vllm: pip install -e '.[gpu]' (vllm 0.32, torch 2.13)")
        raise NotImplementedError(
            "rollout.engine=vllm is not implemented yet in roll_lite (planned behind this interface); use rollout.engine=hf"
        )
    raise ValueError(f"unknown rollout engine '{requested}'; choose hf or vllm")
