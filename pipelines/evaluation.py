"""Held-out evaluation of the RL pipeline: greedy decoding (and k samples) on data.eval_files, scored by
the run's reward functions."""

from __future__ import annotations

import logging
from typing import Callable

import torch

from roll_lite.config import RolloutConfig
from roll_lite.data import DataProto
from roll_lite.data.prompts import PromptData
from roll_lite.rollout import SamplingParams
from roll_lite.runtime.progress import on_terminal, progress_bar

logger = logging.getLogger("roll_lite")
EVAL_CHUNK = 256  # eval prompts per generate call

Generate = Callable[[PromptData, SamplingParams], DataProto]
Score = Callable[[list[DataProto]], "tuple[torch.Tensor, torch.Tensor, dict[str, float]]"]  # PPOPipeline.score_batches


def evaluate_held_out(
    eval_data: PromptData, generate: Generate, score: Score, rollout: RolloutConfig, k: int
) -> tuple[dict[str, float], list[dict]]:
    """(metrics, the greedy answers). Greedy decoding scored by the configured rewards
    (eval/reward_mean, eval/<function>); with k > 0 also k samples per prompt at the rollout's
    temperature: eval/mean@k (mean score) and eval/pass@k (mean over prompts of the best of k scores;
    for 0/1 rewards the share of prompts solved at least once)."""
    scores, per_function, responses = score_in_chunks(
        eval_data, generate, score, SamplingParams(rollout.max_new_tokens, greedy=True, stream="eval")
    )
    # The greedy answers, for the run directory (eval_samples/): what a reload of final/ must reproduce.
    samples = [
        {"prompt": p, "response": text, "answer": a, "score": s}
        for p, text, a, s in zip(eval_data.prompts, responses, eval_data.answers, scores.tolist())
    ]
    metrics = {"eval/reward_mean": scores.mean().item(), **{f"eval/{name}": v for name, v in per_function.items()}}
    if k > 0:
        params = SamplingParams(
            rollout.max_new_tokens, k, rollout.temperature, rollout.top_p, rollout.top_k, stream="eval"
        )
        sampled, _, _ = score_in_chunks(eval_data, generate, score, params)
        sampled = sampled.view(-1, k)  # [prompts, k]: generate returns each prompt's samples together
        metrics[f"eval/mean@{k}"] = sampled.mean().item()
        metrics[f"eval/pass@{k}"] = sampled.max(dim=1).values.mean().item()
    return metrics, samples


def score_in_chunks(
    eval_data: PromptData, generate: Generate, score: Score, params: SamplingParams
) -> tuple[torch.Tensor, dict[str, float], list[str]]:
    """Scores and response texts of every eval (prompt, sample) in order, and the reward metrics over all
    of them: generated EVAL_CHUNK prompts at a time, scored in one call (a mean or a count per domain or
    source is then over the whole set, not a mean of the chunks')."""
    batches, prompts = [], len(eval_data)
    several_chunks = prompts > EVAL_CHUNK  # a long evaluation: show its progress
    bar = progress_bar(prompts, "evaluation", unit="prompt", show=several_chunks)
    for start in range(0, prompts, EVAL_CHUNK):
        chunk = eval_data.select(range(start, min(start + EVAL_CHUNK, prompts)))
        batches.append(generate(chunk, params))
        bar.update(len(chunk))
        if several_chunks and not on_terminal():
            logger.info("evaluation: %d/%d prompts", start + len(chunk), prompts)
    bar.close()
    scores, _, metrics = score(batches)
    responses = [text for batch in batches for text in batch.non_tensor_batch["response_text"]]
    return scores, metrics, responses
