"""Each pipeline's step trace: one dict per traced sample, in roll_lite/runtime/traces.py's COLUMNS.

A step sets `self.step_trace` to what these return; RunSession.end_step writes it (docs/traces.md). A
step traces its first trace.samples_per_step samples (all of them by default; none with 0).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from roll_lite.config.trace import traced_count

if TYPE_CHECKING:
    from roll_lite.data import DataProto
    from roll_lite.data.pairs import PairData
    from roll_lite.data.sft import SFTData
    from roll_lite.environments.episodes import Episode

# per-token columns: the batch's token-aligned tensor each is read from
TOKEN_COLUMNS = {
    "token_advantages": "advantages",
    "engine_log_probs": "rollout_log_probs",
    "trainer_log_probs": "old_log_probs",
    "reference_log_probs": "ref_log_probs",
    "teacher_log_probs": "teacher_log_probs",
}


def tracing(config) -> bool:
    return config.trace.samples_per_step != 0


def mark_for_trace(batch: DataProto, reward) -> None:
    """Right after `reward` (the RewardClient) scored `batch`, before anything zeroes a mask (DAPO's
    overlong filter, the unscored rows' drop): where each row's response starts and its sources'
    outcomes (RewardClient.outcomes; a stand-in scorer of a test without them: none), carried with the
    row wherever the step's batch goes (dynamic sampling's selections, their concatenation)."""
    batch.non_tensor_batch["response_start"] = objects(batch["response_mask"].argmax(-1).tolist())
    if hasattr(reward, "outcomes"):
        batch.non_tensor_batch["reward_outcomes"] = objects(reward.outcomes())


def objects(values: list) -> np.ndarray:
    """A non-tensor column: one object per row (a list of lists stays one list per row)."""
    column = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        column[i] = value
    return column


def rl_trace(pipeline, step: int, batch: DataProto, scores: torch.Tensor, weights_behind: int) -> list[dict]:
    """The trace of a PPO / GRPO / distillation / multi-turn step: each traced row's prompt and response
    (text and ids), reward and its sources' outcomes, advantage, and per response token the loss mask,
    advantage, weight version and the log-probs the step has (engine, trainer, reference, teacher).
    A multi-turn pipeline's rows are its episodes (pipeline.kept): their turns too."""
    n = traced_count(pipeline.config.trace, len(batch))
    if n == 0:
        return []
    tokenizer, nt = pipeline.tokenizer, batch.non_tensor_batch
    episodes: list[Episode] | None = getattr(pipeline, "kept", None) if "model_mask" in batch else None
    starts = (
        list(nt["response_start"][:n]) if "response_start" in nt else batch["response_mask"][:n].argmax(-1).tolist()
    )
    ends = batch["attention_mask"][:n].sum(-1).tolist()
    ids = batch["input_ids"][:n].tolist()
    loss_mask = batch[pipeline.loss_mask_key][:n].tolist()
    per_token = {name: batch[key][:n].tolist() for name, key in TOKEN_COLUMNS.items() if key in batch}
    versions = batch["rollout_versions"][:n].tolist() if "rollout_versions" in batch else None
    scored = batch["scored"][:n].tolist() if "scored" in batch else None
    groups = batch["group_ids"][:n].tolist() if "group_ids" in batch else None
    rows = []
    for i in range(n):
        start, end = starts[i], ends[i]
        response_ids = ids[i][start:end]
        row: dict[str, Any] = {
            "sample": i,
            "group": None if groups is None else groups[i],
            "prompt": tokenizer.decode(ids[i][:start]),
            "prompt_ids": ids[i][:start],
            "response": nt["response_text"][i] if episodes is None else tokenizer.decode(response_ids),
            "response_ids": response_ids,
            "answer": None if nt.get("answer") is None or nt["answer"][i] is None else str(nt["answer"][i]),
            "reward": float(scores[i]),
            "scored": None if scored is None else bool(scored[i]),
            "loss_mask": loss_mask[i][start:end],
            **{name: values[i][start:end] for name, values in per_token.items()},
        }
        if "reward_outcomes" in nt:
            row["reward_sources"] = [
                {"source": source, "score": score, "outcome": kind, "reason": reason}
                for source, score, kind, reason in nt["reward_outcomes"][i]
            ]
            if row["scored"] is None:  # reward.on_failure=zero: the batch does not mark them
                row["scored"] = all(source["outcome"] == "ok" for source in row["reward_sources"])
        trained = [a for a, m in zip(row.get("token_advantages", []), row["loss_mask"]) if m]
        row["advantage"] = sum(trained) / len(trained) if trained else None
        if versions is not None:
            row["weight_versions"] = versions[i][start:end]
        elif episodes is None:  # every token sampled by the weights of the step's rollout
            row["weight_versions"] = [step - 1 - weights_behind] * len(response_ids)
        if "trainer_log_probs" in row and "engine_log_probs" in row:
            row["log_prob_gap"] = [e - t for e, t in zip(row["engine_log_probs"], row["trainer_log_probs"])]
        if episodes is not None:
            row.update(episode_columns(episodes[i], tokenizer))
        rows.append(row)
    return rows


def episode_columns(episode: Episode, tokenizer) -> dict[str, Any]:
    """A multi-turn row's turns (each model turn, the environment's reply after it, its reward, weight
    version and the environment's time), its end and fault, and the weight version of every token."""
    from .async_episodes import turn_token_versions

    assert episode.trajectory is not None  # a kept episode has one
    step_seconds = getattr(episode, "step_seconds", [])  # [0]: the reset's; an episode of an older checkpoint: none
    step_metrics = getattr(episode, "step_metrics", [])
    pieces, turns, turn = episode.trajectory.pieces, [], 0
    for index, (ids, log_probs) in enumerate(pieces):
        if log_probs is None:
            continue
        reply = pieces[index + 1][0] if index + 1 < len(pieces) else None
        turns.append(
            {
                "text": episode.turn_texts[turn],
                "ids": ids,
                "reply": None if reply is None else tokenizer.decode(reply),
                "reply_ids": reply,
                "reward": episode.turn_rewards[turn],
                "weight_version": episode.turn_versions[turn] if turn < len(episode.turn_versions) else None,
                "env_seconds": step_seconds[turn + 1] if turn + 1 < len(step_seconds) else None,
                "metrics": json.dumps(step_metrics[turn]) if turn < len(step_metrics) else None,
            }
        )
        turn += 1
    return {
        "turns": turns,
        "end": episode.end,
        "fault": episode.fault,
        "weight_versions": turn_token_versions(episode),
    }


def sft_trace(config, tokenizer, rows: SFTData) -> list[dict]:
    """An SFT step's samples: the sequence (text and ids) and its loss mask."""
    n = traced_count(config.trace, len(rows))
    return [
        {"sample": i, "text": tokenizer.decode(ids), "ids": ids, "loss_mask": mask}
        for i, (ids, mask) in enumerate(zip(rows.input_ids[:n], rows.target_masks[:n]))
    ]


def pair_trace(config, tokenizer, pairs: PairData) -> list[dict]:
    """A DPO / reward-model step's pairs: the prompt, the chosen and the rejected response (text, and the
    ids of the whole sequence each), and the pair's margin when the data has them."""
    n = traced_count(config.trace, len(pairs))
    rows = []
    for i in range(n):
        (chosen, chosen_mask), (rejected, rejected_mask) = pairs.chosen[i], pairs.rejected[i]
        start = chosen_mask.index(1) if 1 in chosen_mask else len(chosen)
        rows.append(
            {
                "sample": i,
                "prompt": tokenizer.decode(chosen[:start]),
                "chosen": tokenizer.decode([t for t, m in zip(chosen, chosen_mask) if m]),
                "rejected": tokenizer.decode([t for t, m in zip(rejected, rejected_mask) if m]),
                "chosen_ids": chosen,
                "rejected_ids": rejected,
                "margin": None if pairs.margins is None else float(pairs.margins[i]),
            }
        )
    return rows
