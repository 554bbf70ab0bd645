"""Scalar heads on a vision-language model (docs/vision.md, "A critic (and reward model) on a VLM"): the
critic's value head and a reward model's score head read the final hidden states of VisionLMWithLogProbs' trunk
(roll_lite/model/vision.py: each micro-batch's images merged into their tokens, M-RoPE's three rows restarted per
packed sequence, the placeholder pass of a trainable tower when the micro-batch has no image) exactly as
CausalLMWithValueHead and CausalLMWithScoreHead (roll_lite/model/modeling.py) read a text LM's."""

from __future__ import annotations

import torch
from torch import nn

from roll_lite.model.modeling import seeded_score_head, zero_value_head
from roll_lite.model.vision import VisionLMWithLogProbs


class _ScalarHeadOnVision(VisionLMWithLogProbs):
    """The VLM's trunk without its LM head, then `head_outputs`; no sequence parallelism (nor teacher top-k)."""

    slices_whole_sequence = False

    def forward(
        self,
        input_ids,
        position_ids,
        attention_mask=None,
        cu_seqlens=None,
        max_seqlen=None,
        pixel_values=None,
        image_grid_thw=None,
        temperature: float = 1.0,
        with_entropy: bool = False,
        top_k: int = 0,
        gather_ids=None,
        sequence_parallel=None,
        sequence_slice: slice | None = None,
    ) -> dict[str, torch.Tensor]:
        """`temperature`, `with_entropy` and `gather_ids` (a teacher's top-k ids, carried by the batch for the
        policy) are the policy's: unused here."""
        if top_k or sequence_parallel is not None:
            raise NotImplementedError(
                f"{type(self).__name__}: no sequence parallelism or teacher top-k for a value or score head on a "
                "vision-language model"
            )
        images = (pixel_values, image_grid_thw)
        hidden = self.trunk(input_ids, position_ids, attention_mask, cu_seqlens, max_seqlen, *images)
        return self.head_outputs(hidden)

    def head_outputs(self, hidden: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError


class VisionLMWithValueHead(_ScalarHeadOnVision):
    """PPO critic on a VLM: {'values'}, next-token aligned as CausalLMWithValueHead's; the head starts at zero."""

    def __init__(self, lm: nn.Module):
        super().__init__(lm)
        self.value_head = zero_value_head(lm.config.get_text_config().hidden_size, next(lm.parameters()).dtype)

    def head_outputs(self, hidden: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"values": self.value_head(hidden).squeeze(-1).clone()}  # a fresh tensor: FSDP2 warns on views


class VisionLMWithScoreHead(_ScalarHeadOnVision):
    """Reward model on a VLM: {'scores'}, laid out and aligned as CausalLMWithScoreHead's (a bias-free `score`
    drawn from `seed`; token t, after alignment, holds the score of the sequence ending at token t)."""

    def __init__(self, lm: nn.Module, seed: int = 0):
        super().__init__(lm)
        self.score = seeded_score_head(lm.config.get_text_config(), next(lm.parameters()).dtype, seed)

    def head_outputs(self, hidden: torch.Tensor) -> dict[str, torch.Tensor]:
        # one position ahead (the wrapped-around last column is never read): alignment moves it back
        return {"scores": torch.roll(self.score(hidden).squeeze(-1).clone(), shifts=-1, dims=1)}
