"""Models as the strategy sees them: a HF causal LM wrapped to return per-token tensors.

`CausalLMWithLogProbs` runs the decoder and turns its hidden states into per-token log-probs (and
entropy) with the chunked LM head, inside one forward so that FSDP2 has the LM head's weight
gathered while it is used; `CausalLMWithValueHead` returns values for the critic. Outputs are
dicts of "next-token aligned" [rows, seq] tensors: position j holds the quantity for token j+1
(e.g. log p(token j+1 | tokens ≤ j)); `forward_micro_batch` makes them token-aligned.

transformers' model classes (AutoModelForCausalLM, attention.py's hooks) are imported in the functions
that build a model: the driver imports this module through the worker classes and builds none, and
those imports cost it ~1 s of CPU per run.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

import torch
from torch import nn
from transformers import AutoConfig, PretrainedConfig

from roll_lite.model.logprobs import chunked_log_probs, chunked_top_k
from roll_lite.model.moe import MOE_MODEL_KEYS, MOE_MODEL_TYPES, is_moe


def build_causal_lm(
    model_config: Mapping[str, Any] | PretrainedConfig, dtype: torch.dtype = torch.float32, seed: int | None = None
) -> nn.Module:
    """A randomly initialised HF causal LM from a config (dict with `model_type`, or a config object)."""
    from transformers import AutoModelForCausalLM

    from roll_lite.model.attention import register_attention

    if isinstance(model_config, Mapping):
        settings = dict(model_config)
        if "model_type" not in settings:
            raise ValueError(f"model config needs a 'model_type' (e.g. qwen2, llama); got keys {sorted(settings)}")
        model_config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    if seed is not None:
        torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(model_config, attn_implementation=register_attention(), dtype=dtype)
    if dtype == torch.float64 and is_moe(model):
        model.set_experts_implementation("eager")  # transformers' default grouped_mm does not take float64
    return model


def use_packed_attention(model: nn.Module) -> nn.Module:
    """Switch an existing HF model (e.g. from_pretrained) to the packing-aware attention."""
    from roll_lite.model.attention import register_attention

    model.set_attn_implementation(register_attention())
    return model


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks of a wrapper (CausalLMWithLogProbs / CausalLMWithValueHead)."""
    layers = getattr(model.decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(f"{type(model.lm).__name__}: cannot find the decoder layers (expected get_decoder().layers)")
    return layers


def packed_attention_kwargs(cu_seqlens, max_seqlen) -> dict:
    """A packed row's forward kwargs (roll_lite/model/attention.py reads them); none for a padded batch."""
    if cu_seqlens is None:
        return {}
    return dict(cu_seq_lens_q=cu_seqlens, cu_seq_lens_k=cu_seqlens, max_length_q=max_seqlen, max_length_k=max_seqlen)


class _HeadOnDecoder(nn.Module):
    """A head on the decoder of a HF causal LM (`self.lm`); `hidden_states` handles packing."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    @property
    def decoder(self) -> nn.Module:
        return self.lm.get_decoder()

    def hidden_states(
        self, input_ids, position_ids, attention_mask, cu_seqlens, max_seqlen, sequence_parallel=None
    ) -> torch.Tensor:
        """`sequence_parallel`: the strategy's Ulysses exchange (attention.py); the inputs are then this
        rank's slice of the sequence, and cu_seqlens / attention_mask the whole sequence's."""
        packed = packed_attention_kwargs(cu_seqlens, max_seqlen)
        if sequence_parallel is not None:
            packed["sequence_parallel"] = sequence_parallel
        return self.decoder(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **packed
        ).last_hidden_state


class CausalLMWithLogProbs(_HeadOnDecoder):
    """Policy / reference model: {'log_probs', 'entropy' (if asked)}, next-token aligned."""

    def __init__(self, lm: nn.Module, chunk_size: int = 1024):
        super().__init__(lm)
        if getattr(lm.get_output_embeddings(), "bias", None) is not None:
            raise NotImplementedError("LM heads with a bias are not supported by the chunked log-prob head")
        self.chunk_size = chunk_size

    def forward(
        self,
        input_ids,
        position_ids,
        attention_mask=None,
        cu_seqlens=None,
        max_seqlen=None,
        temperature: float = 1.0,
        with_entropy: bool = False,
        top_k: int = 0,
        gather_ids: torch.Tensor | None = None,
        targets: torch.Tensor | None = None,
        sequence_parallel=None,
    ) -> dict[str, torch.Tensor]:
        """top_k > 0 (a teacher, no grad) adds 'top_k_ids' and 'top_k_log_probs' [.., k], the k most
        likely next tokens; `gather_ids` [rows, seq, k] (next-token aligned ids, a student) adds
        'top_k_log_probs', the log-probs of those ids, from the same chunked pass as the sampled token's.
        `targets` [rows, seq]: the next token of each position, when input_ids are a slice of the sequence
        (sequence parallelism: a slice's last next token is the next slice's first); None: input_ids shifted."""
        hidden = self.hidden_states(input_ids, position_ids, attention_mask, cu_seqlens, max_seqlen, sequence_parallel)
        hidden = hidden.reshape(-1, hidden.shape[-1])
        weight = self.lm.get_output_embeddings().weight
        if targets is None:
            targets = torch.roll(input_ids, shifts=-1, dims=1)  # the last column is never used
        targets = targets.reshape(-1, 1)
        if gather_ids is not None:
            targets = torch.cat([targets, gather_ids.reshape(len(targets), -1)], dim=1)
        log_probs, entropy = chunked_log_probs(
            hidden,
            weight,
            targets if gather_ids is not None else targets[:, 0],
            chunk_size=self.chunk_size,
            temperature=temperature,
            with_entropy=with_entropy,
        )
        # Fresh tensors, not views: FSDP2 warns that in-place ops on a view output would skip its hooks.
        sampled = log_probs[:, 0] if gather_ids is not None else log_probs
        outputs = {"log_probs": sampled.reshape(input_ids.shape).clone()}
        if gather_ids is not None:
            outputs["top_k_log_probs"] = log_probs[:, 1:].reshape(*input_ids.shape, -1).clone()
        if entropy is not None:
            outputs["entropy"] = entropy.reshape(input_ids.shape).clone()
        if top_k:
            ids, top = chunked_top_k(hidden, weight, top_k, chunk_size=self.chunk_size, temperature=temperature)
            outputs.update(
                top_k_ids=ids.reshape(*input_ids.shape, top_k), top_k_log_probs=top.reshape(*input_ids.shape, top_k)
            )
        return outputs


def zero_value_head(width: int, dtype: torch.dtype) -> nn.Linear:
    """A critic's value head: width -> 1, starting at zero (every value 0 before the first update)."""
    head = nn.Linear(width, 1, dtype=dtype)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    return head


def seeded_score_head(text_config, dtype: torch.dtype, seed: int) -> nn.Linear:
    """A reward model's bias-free score head (`score.weight`, as transformers' *ForSequenceClassification), drawn
    as transformers initialises it (normal, std `initializer_range`) from the run's `seed`. `text_config`: the
    language model's config (its hidden_size)."""
    head = nn.Linear(text_config.hidden_size, 1, bias=False, dtype=dtype)
    std = getattr(text_config, "initializer_range", 0.02)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=torch.Generator().manual_seed(seed)) * std)
    return head


class CausalLMWithValueHead(_HeadOnDecoder):
    """PPO critic: the decoder of a causal LM plus a linear value head: {'values'}, next-token
    aligned (the hidden state before token t values the state in which token t is generated)."""

    def __init__(self, lm: nn.Module):
        super().__init__(lm)
        self.value_head = zero_value_head(lm.config.hidden_size, next(lm.parameters()).dtype)

    def forward(
        self,
        input_ids,
        position_ids,
        attention_mask=None,
        cu_seqlens=None,
        max_seqlen=None,
        temperature: float = 1.0,
        with_entropy: bool = False,
        sequence_parallel=None,
        gather_ids: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """`gather_ids`: a distillation teacher's top-k ids, carried by the batch for the policy: unused here."""
        hidden = self.hidden_states(input_ids, position_ids, attention_mask, cu_seqlens, max_seqlen, sequence_parallel)
        # squeeze(-1) alone returns a view, and FSDP2 warns on view outputs (see CausalLMWithLogProbs).
        return {"values": self.value_head(hidden).squeeze(-1).clone()}


class CausalLMWithScoreHead(_HeadOnDecoder):
    """Reward model (Bradley–Terry): the decoder of a causal LM plus a bias-free linear score head,
    laid out as transformers' *ForSequenceClassification with one label (`score.weight`), so that
    `sequence_classifier_state` exports it as one. {'scores'}: after `forward_micro_batch`'s
    next-token alignment, token t holds the score of the sequence ending at token t (the head reads
    the hidden state one position ahead; token 0 has none)."""

    def __init__(self, lm: nn.Module, seed: int = 0):
        super().__init__(lm)
        self.score = seeded_score_head(lm.config, next(lm.parameters()).dtype, seed)

    def forward(
        self,
        input_ids,
        position_ids,
        attention_mask=None,
        cu_seqlens=None,
        max_seqlen=None,
        temperature: float = 1.0,
        with_entropy: bool = False,
        sequence_parallel=None,
    ) -> dict[str, torch.Tensor]:
        """With `sequence_parallel` the scores of this rank's slice as they are: the exchange moves them one
        position ahead once it holds the whole sequence's (a slice's last needs the next slice's first)."""
        hidden = self.hidden_states(input_ids, position_ids, attention_mask, cu_seqlens, max_seqlen, sequence_parallel)
        scores = self.score(hidden).squeeze(-1).clone()
        if sequence_parallel is not None:
            return {"scores": scores}
        # One position ahead (the wrapped-around last column is never read): alignment moves it back.
        return {"scores": torch.roll(scores, shifts=-1, dims=1)}


def sequence_classifier_state(lm: nn.Module, state: dict[str, torch.Tensor]) -> tuple[nn.Module, dict]:
    """A one-label transformers *ForSequenceClassification of `lm`'s architecture, and the state dict
    that makes it the trained reward model: the decoder's weights and the score head (the LM head
    is dropped). `state` holds the strategy's HF names (`model.layers...`, `score.weight`)."""
    from transformers import AutoModelForSequenceClassification

    config = copy.deepcopy(lm.config)
    config.num_labels = 1
    classifier = AutoModelForSequenceClassification.from_config(config, dtype=state["score.weight"].dtype)
    prefix = classifier.base_model_prefix
    decoder_prefix = f"{lm.base_model_prefix}."
    weights = {
        f"{prefix}.{name.removeprefix(decoder_prefix)}": value
        for name, value in state.items()
        if name.startswith(decoder_prefix)
    }
    weights["score.weight"] = state["score.weight"]
    return classifier, weights


# the architecture keys of the `model` config section (a model built from config)
BUILT_MODEL_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "tie_word_embeddings",
)


def causal_lm_config(model_config, vocab_size: int) -> PretrainedConfig:
    """The HF config of the run's model: `pretrained_path`'s config.json, or the `model` keys with the
    tokenizer's vocabulary."""
    if model_config.pretrained_path:
        return AutoConfig.from_pretrained(
            model_config.pretrained_path, trust_remote_code=model_config.trust_remote_code
        )
    settings = {key: getattr(model_config, key) for key in BUILT_MODEL_KEYS}
    if model_config.model_type in MOE_MODEL_TYPES:
        settings.update({key: getattr(model_config, key) for key in MOE_MODEL_KEYS})
        if model_config.model_type == "qwen2_moe":  # its shared expert, as wide as a dense MLP
            settings["shared_expert_intermediate_size"] = model_config.intermediate_size
    return AutoConfig.for_model(model_config.model_type, vocab_size=vocab_size, **settings)


def load_causal_lm(model_config, vocab_size: int, seed: int) -> nn.Module:
    """The run's model from its `model` config section: `pretrained_path` (a local folder or a hub
    id; its own code only with `trust_remote_code`), or a fresh model of that architecture (random
    init from `seed`, vocabulary of the tokenizer). Every worker calls this, so the actor, the
    reference and the critic's backbone start from the same weights."""
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, model_config.dtype)
    if model_config.pretrained_path:
        model = AutoModelForCausalLM.from_pretrained(
            model_config.pretrained_path, dtype=dtype, trust_remote_code=model_config.trust_remote_code
        )
        return use_packed_attention(model)
    return build_causal_lm(causal_lm_config(model_config, vocab_size), dtype=dtype, seed=seed)


def enable_gradient_checkpointing(lm: nn.Module) -> nn.Module:
    """Recompute each decoder layer's activations in backward (HF's own checkpointing, non-reentrant,
    which works under FSDP2 and with packed input). Only acts in train mode."""
    if not getattr(lm, "supports_gradient_checkpointing", False):
        raise ValueError(f"model.gradient_checkpointing: {type(lm).__name__} does not support gradient checkpointing")
    lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return lm
