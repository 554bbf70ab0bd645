"""PPOPipeline.evaluate on held-out prompts: greedy reward, and mean@k / pass@k from k samples,
against the same responses scored and aggregated by hand; rows keep their extra fields.

The pipeline runs in-process here, without Ray: a real transformers model behind HFEngine (the
rollout worker's engine), and as the reward the response's length (an untrained model rarely
scores on a real task, and the aggregation needs scores that differ)."""

import json

import pytest
import torch

from roll_lite.config import load_config
from roll_lite.model.modeling import load_causal_lm
from roll_lite.rollout import HFEngine, SamplingParams

TINY = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_hidden_layers=2",
    "model.num_attention_heads=2",
    "model.num_key_value_heads=1",
    "rollout.max_new_tokens=4",
    "rollout.temperature=2.0",
]
ROWS = [
    {"prompt": "12=", "answer": "21", "id": 0},
    {"prompt": "345=", "answer": "543", "id": 1},
    {"prompt": "6=", "answer": "6", "id": 2},
]


def length_score(response: str) -> float:
    return len(response) / 4


class LengthReward:
    def score(self, responses, answers, *extra):
        values = torch.tensor([length_score(r) for r in responses])
        return values, torch.ones(len(values), dtype=torch.bool), {"reward/length": values.mean().item()}


class Recording:
    """The engine, keeping what it returned for the hand computation."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def generate(self, prompts, params):
        completions = self.engine.generate(prompts, params)
        self.calls.append((params, completions.token_ids))
        return completions


def pipeline_on(tmp_path, k):
    from roll_lite.pipelines.ppo import PPOPipeline

    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    config = load_config(
        None, TINY + [f"data.train_files={path}", f"data.eval_files={path}", f"data.eval_num_samples={k}"]
    )
    pipeline = PPOPipeline(config)
    pipeline.prepare_data()
    model = load_causal_lm(config.model, len(pipeline.tokenizer), seed=0)
    pipeline.rollout = Recording(
        HFEngine(model, pipeline.tokenizer.pad_token_id, pipeline.tokenizer.eos_token_id, seed=3)
    )
    pipeline.reward = LengthReward()
    return pipeline


def test_greedy_mean_and_pass_at_k_match_a_hand_computation(tmp_path):
    k = 4
    pipeline = pipeline_on(tmp_path, k)
    metrics = pipeline.evaluate()
    (greedy, greedy_out), (sampled, sampled_out) = pipeline.rollout.calls
    assert greedy.greedy and not sampled.greedy and sampled.num_samples == k and sampled.temperature == 2.0
    score = lambda ids: length_score(pipeline.tokenizer.decode(ids, skip_special_tokens=True))  # noqa: E731
    greedy_scores = [score(out) for out in greedy_out]
    per_prompt = [[score(out) for out in sampled_out[p * k : (p + 1) * k]] for p in range(3)]
    assert metrics["eval/reward_mean"] == pytest.approx(sum(greedy_scores) / 3, abs=1e-6)
    assert metrics["eval/reward/length"] == pytest.approx(sum(greedy_scores) / 3, abs=1e-6)
    assert metrics[f"eval/mean@{k}"] == pytest.approx(sum(map(sum, per_prompt)) / (3 * k), abs=1e-6)
    assert metrics[f"eval/pass@{k}"] == pytest.approx(sum(max(scores) for scores in per_prompt) / 3, abs=1e-6)
    assert any(min(scores) < max(scores) for scores in per_prompt)  # means and maxima differ: the check can fail


def test_greedy_only_by_default_and_rows_keep_their_extra_fields(tmp_path):
    pipeline = pipeline_on(tmp_path, 0)
    metrics = pipeline.evaluate()
    assert len(pipeline.rollout.calls) == 1 and not any("@" in key for key in metrics)
    batch = pipeline.generate(pipeline.eval_data.select([2, 0]), SamplingParams(4, num_samples=2))
    assert list(batch.non_tensor_batch["answer"]) == ["6", "6", "21", "21"]
    assert list(batch.non_tensor_batch["extra"]) == [{"id": 2}, {"id": 2}, {"id": 0}, {"id": 0}]
    assert batch["group_ids"].tolist() == [0, 0, 1, 1]


def test_a_held_out_set_generated_in_chunks_is_scored_in_one_call(tmp_path, monkeypatch):
    """Metrics over subsets (a domain's mean, a source's failure count) are over the whole set: a mean of
    the chunks' means weighted by chunk size would be wrong for both."""
    import roll_lite.pipelines.evaluation as evaluation

    class Counting(LengthReward):
        rows: list[int] = []

        def score(self, responses, answers, *extra):
            self.rows.append(len(responses))
            values, scored, _ = super().score(responses, answers, *extra)
            short = values < 0.5
            return values, scored, {"reward/length/failed": float(short.sum())}

    monkeypatch.setattr(evaluation, "EVAL_CHUNK", 2)  # 3 prompts: generated as 2 + 1
    pipeline = pipeline_on(tmp_path, 0)
    pipeline.reward = Counting()
    metrics = pipeline.evaluate()
    assert [len(ids) for _, ids in pipeline.rollout.calls] == [2, 1] and pipeline.reward.rows == [3]
    scores = [
        length_score(pipeline.tokenizer.decode(ids, skip_special_tokens=True))
        for _, out in pipeline.rollout.calls
        for ids in out
    ]
    assert metrics["eval/reward/length/failed"] == sum(s < 0.5 for s in scores)
    assert metrics["eval/reward_mean"] == pytest.approx(sum(scores) / 3, abs=1e-6)
