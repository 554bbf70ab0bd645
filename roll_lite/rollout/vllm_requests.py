"""What the vllm engine (vllm_engine.py) asks vLLM for and how it reads the answers: each request's
vllm.SamplingParams, the seeds of each generate call, the logprobs_mode whose log-probs are the actor's
quantity, and vLLM's RequestOutputs as Completions. Plain functions, no vllm import."""

from __future__ import annotations

import random
from typing import Any

from roll_lite.rollout.engine import SEED_OFFSETS, Completions, SamplingParams


def vllm_logprobs_mode(temperature: float, top_p: float, top_k: int) -> str:
    """The vLLM `logprobs_mode` whose sampled-token log-probs equal log softmax(logits / temperature)
    over the whole vocabulary (what the actor and the hf engine compute). vLLM's processed log-probs
    are renormalised over the tokens top-k / top-p keep; its raw ones ignore the temperature."""
    if top_p == 1.0 and top_k == 0:
        return "processed_logprobs"  # temperature applied, nothing truncated
    if temperature == 1.0:
        return "raw_logprobs"  # log softmax(logits) is already the quantity
    raise ValueError(
        "rollout.engine=vllm cannot return log softmax(logits / temperature) when top-k / top-p truncate "
        f"and the temperature is not 1 (rollout.temperature={temperature}, rollout.top_p={top_p}, "
        f"rollout.top_k={top_k}): set rollout.top_p=1 and rollout.top_k=0, or rollout.temperature=1"
    )


def vllm_sampling_kwargs(
    params: SamplingParams, eos_token_id: int, request_seed: int | None, allowed_token_ids: list[int] | None = None
) -> dict[str, Any]:
    """vllm.SamplingParams(**these) for one prompt. vLLM gives the n samples of a seeded request the
    seeds request_seed + 0 .. n-1. `allowed_token_ids`: the only ids sampled (a vision-language model's
    vocabulary without its vision tokens); vLLM masks the others to -inf before sampling and before its
    processed log-probs, which are then over the same restricted vocabulary as the policy head's."""
    kwargs: dict[str, Any] = dict(
        max_tokens=params.max_new_tokens,
        stop_token_ids=[eos_token_id],  # the tokenizer's EOS; no tokenizer in the engine (token-id prompts)
        detokenize=False,
        ignore_eos=False,
    )
    if allowed_token_ids is not None:
        kwargs["allowed_token_ids"] = allowed_token_ids
    if params.greedy:
        if params.num_samples != 1:
            raise ValueError("greedy decoding gives one completion per prompt; set num_samples=1")
        return {**kwargs, "n": 1, "temperature": 0.0}
    # logprobs=0: only the sampled token's log-prob
    return {
        **kwargs,
        "n": params.num_samples,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "seed": request_seed,
        "logprobs": 0,
    }


def request_seeds(seed: int, call: int, num_prompts: int, num_samples: int, stream: str = "train") -> list[int]:
    """One seed per prompt for generate call number `call` of `stream` (SamplingParams.stream):
    reproducible from (seed, call, stream), different for every call, and far enough apart that no two
    samples (seed + 0 .. n-1) share a generator."""
    first = random.Random(seed * 1_000_003 + call + SEED_OFFSETS[stream]).randrange(2**40)
    return [first + i * num_samples for i in range(num_prompts)]


def completions_from_outputs(outputs: list, params: SamplingParams, eos_token_id: int) -> Completions:
    """vLLM's RequestOutputs (one per prompt, in prompt order) -> Completions, prompt-major."""
    token_ids: list[list[int]] = []
    log_probs: list[list[float]] | None = None if params.greedy else []
    for prompt_index, output in enumerate(outputs):
        samples = sorted(output.outputs, key=lambda sample: sample.index)
        if len(samples) != params.num_samples:
            raise RuntimeError(
                f"vllm returned {len(samples)} completions for prompt {prompt_index}, asked for {params.num_samples}"
            )
        for sample in samples:
            tokens = list(sample.token_ids)
            # the stop token is in token_ids (vLLM appends a token before checking it); the loss mask
            # and the reward need it there, as from the hf engine
            if sample.finish_reason == "stop" and (not tokens or tokens[-1] != eos_token_id):
                raise RuntimeError(
                    f"vllm stopped prompt {prompt_index}'s completion {sample.index} without "
                    f"EOS ({eos_token_id}) as its last token: {tokens[-3:]}"
                )
            token_ids.append(tokens)
            if log_probs is not None:
                log_probs.append(_sampled_log_probs(sample, tokens))
    return Completions(token_ids, log_probs)


def _sampled_log_probs(sample, tokens: list[int]) -> list[float]:
    """Each sampled token's log-prob from vLLM's per-position {token id: Logprob} (logprobs=0)."""
    positions = sample.logprobs
    if positions is None or len(positions) != len(tokens):
        raise RuntimeError(
            f"vllm returned log-probs for {0 if positions is None else len(positions)} of {len(tokens)} sampled tokens"
        )
    values = []
    for token, position in zip(tokens, positions):
        if position is None or token not in position:
            raise RuntimeError(f"vllm returned no log-prob for sampled token {token}")
        values.append(float(position[token].logprob))
    return values
