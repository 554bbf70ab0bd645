"""The policy model as the strategy sees it: a HF causal LM that returns token log-probs.

`CausalLMWithLogProbs` runs the decoder and turns its hidden states into per-token log-probs (and
entropy) with the chunked LM head, inside one forward so that FSDP2 has the LM head's weight
gathered while it is used. Outputs are "next-token" aligned: position j of a row holds
log p(token j+1 | tokens ≤ j); `micro_batch.forward_micro_batch` turns them token-aligned.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from roll_lite.attention import register_attention
from roll_lite.logprobs import chunked_log_probs


def build_causal_lm(model_config: Mapping[str, Any] | PretrainedConfig, dtype: torch.dtype = torch.float32, seed: int | None = None) -> nn.Module:
    """A randomly initialised HF causal LM from a config (dict with `model_type`, or a config object)."""
    if isinstance(model_config, Mapping):
        settings = dict(model_config)
        if "model_type" not in settings:
            raise ValueError(f"model config needs a 'model_type' (e.g. qwen2, llama); got keys {sorted(settings)}")
        model_config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    if seed is not None:
        torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(model_config, attn_implementation=register_attention(), dtype=dtype)
    return model


def use_packed_attention(model: nn.Module) -> nn.Module:
    """Switch an existing HF model (e.g. from_pretrained) to the packing-aware attention."""
    model.set_attn_implementation(register_attention())
    return model


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    layers = getattr(model.get_decoder(), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(f"{type(model).__name__}: cannot find the decoder layers (expected model.get_decoder().layers)")
    return layers


class CausalLMWithLogProbs(nn.Module):
    def __init__(self, lm: nn.Module, chunk_size: int = 1024):
        super().__init__()
        if getattr(lm.get_output_embeddings(), "bias", None) is not None:
            raise NotImplementedError("LM heads with a bias are not supported by the chunked log-prob head")
        self.lm = lm
        self.chunk_size = chunk_size

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int | None = None,
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        packed = {}
        if cu_seqlens is not None:
            packed = dict(cu_seq_lens_q=cu_seqlens, cu_seq_lens_k=cu_seqlens, max_length_q=max_seqlen, max_length_k=max_seqlen)
        hidden = self.lm.get_decoder()(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **packed
        ).last_hidden_state
        next_tokens = torch.roll(input_ids, shifts=-1, dims=1)  # the last column is never used
        log_probs, entropy = chunked_log_probs(
            hidden.reshape(-1, hidden.shape[-1]),
            self.lm.get_output_embeddings().weight,
            next_tokens.reshape(-1),
            chunk_size=self.chunk_size,
            temperature=temperature,
            with_entropy=with_entropy,
        )
        # Fresh tensors, not views: FSDP2 warns that in-place ops on a view output would skip its hooks.
        shape = input_ids.shape
        return log_probs.reshape(shape).clone(), (entropy.reshape(shape).clone() if entropy is not None else None)
