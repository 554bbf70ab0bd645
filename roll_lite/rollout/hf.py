"""The `hf` rollout engine: transformers `generate`, on CPU or GPU."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable

import torch
from torch import nn

from roll_lite.rollout.engine import (
    SEED_OFFSETS,
    STREAMS,
    Completions,
    SamplingParams,
    load_sampling_state,
    sampling_state,
)


class HFEngine:
    """transformers `generate`, batched over all prompts × samples, left-padded; each row stops at its EOS.

    `static_cache`: a KV cache of fixed shape (transformers' StaticCache) instead of one that grows by
    a token per step. On a GPU transformers then compiles the decoding step (torch.compile, CUDA graphs:
    "reduce-overhead") once per batch size; on CPU it decodes eagerly. The cache keeps the longest
    length any call needed, so calls of the same batch size reuse the compiled step.

    `decode`: a decoding loop to run instead of generate, decode(model, prompts, params, pad_token_id,
    eos_token_id, max_time_s[, images=...]) -> (token ids, log-probs) per row. rollout.exact passes
    roll_lite.model.exact_decoding.exact_generate: batch-invariant kernels, each sampled token's
    log-prob then the actor's own, bit for bit.
    """

    def __init__(
        self,
        model: nn.Module,
        pad_token_id: int,
        eos_token_id: int,
        seed: int = 0,
        static_cache: bool = False,
        decode: Callable | None = None,
        record_experts: Callable[[nn.Module], Any] | None = None,
        excluded_token_ids: list[int] | None = None,
    ):
        from transformers import GenerationConfig

        self.model = model.eval()
        self.model.set_attn_implementation("sdpa")
        # A model folder's generation_config.json (repetition_penalty, top_k, ...) would silently
        # change what is sampled: generate() fills every setting we leave unset from it.
        self.model.generation_config = GenerationConfig(pad_token_id=pad_token_id, eos_token_id=eos_token_id)
        self.static_cache, self.decode = static_cache, decode
        # an MoE policy's routing per token (Completions.routed_experts): roll_lite.model.moe.GenerationRouting
        self.record_experts = record_experts
        # never sampled (a vision-language policy's vision tokens): masked out of the sampling distribution, and
        # the recorded log-probs are over the rest of the vocabulary, as the trainer's (restricted_vocab.py)
        self.excluded_token_ids = excluded_token_ids
        self.pad_token_id, self.eos_token_id = pad_token_id, eos_token_id
        self.device = next(model.parameters()).device
        self.generator_seed = seed
        self.calls = {stream: 0 for stream in STREAMS}  # generate calls so far, per SamplingParams.stream

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        max_time_s: float | None = None,
        images: list[dict | None] | None = None,
    ) -> Completions:
        """`max_time_s`: stop decoding every row once this many seconds have passed (transformers'
        max_time; a row cut there has no EOS and fewer than max_new_tokens tokens). `images`: per
        prompt, its pixel_values and image_grid_thw (None: text only) for a vision-language model; the
        prompts' ids already hold each image's tokens (roll_lite/rollout/images.py): nothing is expanded here."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("generate: every prompt needs at least one token")
        if params.greedy and params.num_samples != 1:
            raise ValueError("greedy decoding gives one completion per prompt; set num_samples=1")
        if self.decode is not None:
            if self.record_experts is not None:
                raise ValueError("generate: the exact decoding loop (rollout.exact) does not record MoE routing yet")
            self._seed(params)
            # a vision-language model's images: the loop merges them at its prefill (roll_lite/model/exact_vision.py)
            token_ids, log_probs = self.decode(
                self.model,
                prompts,
                params,
                self.pad_token_id,
                self.eos_token_id,
                max_time_s,
                **({} if images is None else {"images": images}),
            )
            return Completions(token_ids, None if params.greedy else log_probs)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for i, prompt in enumerate(prompts):
            input_ids[i, width - len(prompt) :] = torch.tensor(prompt)
            attention_mask[i, width - len(prompt) :] = 1
        options: dict[str, Any] = dict(
            max_new_tokens=params.max_new_tokens, pad_token_id=self.pad_token_id, eos_token_id=self.eos_token_id
        )
        if max_time_s is not None:
            options.update(max_time=max_time_s)
        if self.static_cache:
            options.update(cache_implementation="static")
        if images is not None:
            from roll_lite.rollout.images import generation_inputs

            visual = generation_inputs(
                input_ids,
                images,
                self.model.config.image_token_id,
                self.model.config.vision_config.spatial_merge_size,
            )
            options.update({key: value.to(self.device) for key, value in visual.items()})
        recorder = None
        excluding = [ExcludeTokens(self.excluded_token_ids)] if self.excluded_token_ids else []
        if params.greedy:
            options.update(do_sample=False, num_return_sequences=1, logits_processor=excluding)
        else:
            # top_k=0 turns top-k off (transformers' default would be 50)
            recorder = SampledLogProbs(params.temperature)
            options.update(
                do_sample=True,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,
                num_return_sequences=params.num_samples,
                logits_processor=[*excluding, recorder],
            )
        self._seed(params)
        recording = self.record_experts(self.model) if self.record_experts is not None else None
        with recording if recording is not None else nullcontext():
            output = self.model.generate(
                input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device), **options
            )
        new_tokens = output[:, width:]
        log_probs = recorder.finish(new_tokens).tolist() if recorder is not None else None
        token_ids, token_log_probs = [], []
        for i, row in enumerate(new_tokens.tolist()):
            # transformers pads a finished row; a row without EOS ran to max_new_tokens and has no padding
            length = row.index(self.eos_token_id) + 1 if self.eos_token_id in row else len(row)
            token_ids.append(row[:length])
            if log_probs is not None:
                token_log_probs.append(log_probs[i][:length])
        completions = Completions(token_ids, token_log_probs if log_probs is not None else None)
        if recording is not None:
            copies = len(token_ids) // len(prompts)
            prompt_lengths = [len(prompt) for prompt in prompts for _ in range(copies)]
            completions.routed_experts = recording.rows(width, prompt_lengths, [len(row) for row in token_ids])
        return completions

    def _seed(self, params: SamplingParams) -> None:
        # reproducible, different every call of a stream, and the streams apart
        torch.manual_seed(self.generator_seed + SEED_OFFSETS[params.stream] + self.calls[params.stream])
        self.calls[params.stream] += 1

    def state_dict(self) -> dict:
        """Where sampling stands: every generate call reseeds torch with (seed + its stream's calls so far)."""
        return sampling_state(self.generator_seed, self.calls)

    def load_state_dict(self, state: dict) -> None:
        self.generator_seed, self.calls = load_sampling_state(state)

    def update_weights(self, state_dict: dict[str, torch.Tensor], part_of: set[str] | None = None) -> None:
        """Copy `state_dict` into the model's parameters: all of them, or with `part_of` exactly those
        names (LoRA's adapters: the rest stays as it is)."""
        if part_of is None:
            self._load(state_dict, assign=False)
            return
        if set(state_dict) != part_of:
            missing, unexpected = sorted(part_of - set(state_dict)), sorted(set(state_dict) - part_of)
            raise KeyError(
                f"rollout weight sync: missing {missing[:5]} ({len(missing)}), unexpected {unexpected[:5]} "
                f"({len(unexpected)})"
            )
        self.model.load_state_dict(state_dict, strict=False)

    def share_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Make `state_dict`'s tensors the model's parameters (no copy): the engine then samples with
        whatever values they hold (rollout.in_actor: the actor's, updated in place by its optimizer)."""
        current = self.model.state_dict()
        if all(name in current and _same_memory(current[name], t) for name, t in state_dict.items()):
            return  # the model already is these tensors (rollout.in_actor, every step after the first)
        self._load(state_dict, assign=True)

    def _load(self, state_dict: dict[str, torch.Tensor], assign: bool) -> None:
        missing, unexpected = self.model.load_state_dict(state_dict, strict=False, assign=assign)
        tied = getattr(self.model.config, "tie_word_embeddings", False)
        if set(missing) - ({"lm_head.weight"} if tied else set()) or unexpected:
            raise KeyError(f"rollout weight sync: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
        if assign and tied:  # a new embedding Parameter: point the head at it again
            self.model.tie_weights()


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.data_ptr(), a.shape, a.stride(), a.dtype, a.device) == (
        b.data_ptr(),
        b.shape,
        b.stride(),
        b.dtype,
        b.device,
    )


class ExcludeTokens:
    """A transformers logits processor that gives `ids` a logit of -inf: never sampled, and the log-probs
    recorded after it (SampledLogProbs) are over the rest of the vocabulary."""

    def __init__(self, ids: list[int]):
        self.ids = list(ids)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores[:, self.ids] = float("-inf")
        return scores


class SampledLogProbs:
    """A transformers logits processor that records the log-prob of each sampled token.

    Custom processors run before temperature / top-k / top-p, so it sees the model's raw logits; the
    token sampled from them shows up as the last input id of the next call (or, for the last step,
    in `finish`). It keeps one step's log-softmax, not the whole [rows, steps, vocab] logits.
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.previous: torch.Tensor | None = None
        self.collected: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.previous is not None:
            self.collected.append(self.previous.gather(1, input_ids[:, -1:]).squeeze(1))
        self.previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """[rows, new tokens] log-probs, given generate's new tokens."""
        if self.previous is not None:
            self.collected.append(self.previous.gather(1, new_tokens[:, -1:]).squeeze(1))
            self.previous = None
        if len(self.collected) != new_tokens.shape[1]:
            raise RuntimeError(f"recorded {len(self.collected)} log-probs for {new_tokens.shape[1]} generated tokens")
        return torch.stack(self.collected, dim=1).cpu()
