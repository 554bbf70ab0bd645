"""The rollout engines' one small interface (which engine a run gets: rollout/choice.py).

`generate(prompts, params)` takes token-id lists and returns, prompt-major, `params.num_samples`
completions per prompt (token ids, ending with EOS when the model stopped) and, when sampling, each
sampled token's log-prob under the engine's own weights; `update_weights` loads the actor's latest
weights in memory. `hf` (transformers generate, rollout/hf.py) and `vllm` (rollout/vllm_engine.py, on
GPU or, with vLLM's CPU build, on CPU) implement them.
"""

from __future__ import annotations

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
    # whose call this is: "train" (the batches trained on) or "eval" (held-out evaluation). Each stream
    # counts its own calls and seeds from them, so how often a run evaluates never changes its samples.
    stream: str = "train"

    def __post_init__(self) -> None:
        if self.stream not in STREAMS:
            raise ValueError(f"SamplingParams.stream: '{self.stream}' is not one of {', '.join(STREAMS)}")


# what each stream adds to the seed: the eval stream's seeds lie far from any seed + train call count
SEED_OFFSETS = {"train": 0, "eval": 1 << 32}
STREAMS = tuple(SEED_OFFSETS)


def sampling_state(seed: int, calls: dict[str, int]) -> dict[str, int]:
    """An engine's state_dict: its seed and each stream's generate calls so far ("calls": the train
    stream's, the key of checkpoints from before the eval stream)."""
    return {"seed": seed, "calls": calls["train"], "eval_calls": calls["eval"]}


def load_sampling_state(state: dict[str, int]) -> tuple[int, dict[str, int]]:
    """(seed, calls per stream) of a sampling_state; a checkpoint without eval_calls had none."""
    return int(state["seed"]), {"train": int(state["calls"]), "eval": int(state.get("eval_calls", 0))}


@dataclass
class Completions:
    """Prompt-major: `num_samples` completions per prompt."""

    token_ids: list[list[int]]
    # per sampled token, log softmax(logits / temperature) before top-k / top-p, the quantity the actor
    # computes; None for greedy decoding
    log_probs: list[list[float]] | None = None
    # the version of the actor's weights the engine sampled with (set by the rollout worker: the
    # step whose update it had loaded last; 0 = the weights before RL); partial rollouts: the oldest
    weight_version: int = -1
    # partial rollouts (rollout/partial.py): per token, the weight version that sampled it, and the
    # tokens sampled and then thrown away at weight updates (rollout.on_update=drop)
    token_versions: list[list[int]] | None = None
    dropped_tokens: int = 0
    engine_s: float = 0.0  # partial rollouts: seconds the engine generated since the previous batch was taken
    # MoE policies, when the engine records routing (router replay): per row, the experts each MoE layer chose
    # for its prompt and response tokens, [prompt + response tokens, layers, top_k] (roll_lite/model/moe.py)
    routed_experts: list[torch.Tensor] | None = None


class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Completions: ...

    def update_weights(self, state_dict: dict[str, torch.Tensor]) -> None: ...


def merge_routing(known: torch.Tensor | None, generated: torch.Tensor, context: int, kept: int) -> torch.Tensor:
    """A token sequence's experts after a generate call that continued it (a multi-turn trajectory's model turn, a
    partial rollout's segment): [context + kept, layers, k] int16. `generated`: that call's routing of the sequence
    ([context + sampled, layers, k]: the prefill's for the `context` tokens, each decoding step's for the token it
    read, -1 for the last), of which `kept` sampled tokens stay. A token an earlier call's forward read keeps that
    forward's experts (`known`: -1 where none read it): the first read wins."""
    merged = generated[: context + kept].to(torch.int16).clone()
    if known is not None:
        read = (known >= 0).flatten(1).all(-1)  # tokens with a routing: the engine records a whole token or none
        merged[: len(known)][read] = known[read]
    return merged
