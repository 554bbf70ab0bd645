"""rollout.exact: the hf engine's log-probs equal the actor's bit for bit (roll_lite/model/exact_decoding.py,
roll_lite/model/batch_invariant.py; docs/on-policy.md).

The engine decodes a batch of left-padded prompts with a KV cache; the actor scores the finished rows with
the strategy's own forward (forward_micro_batch) however they are micro-batched, padded or packed, in eval
mode (old log-probs) and in train mode with gradients (the on-policy step's log-probs, and rollout_bypass's
ratio). Single-turn in float32 and bfloat16, multi-turn (a second turn generated in another batch after an
environment's tokens), LoRA; the default mode differs; the mismatch metrics and TIS weights show it; and the
settings that would break it are config errors."""

import copy
import json
from pathlib import Path

import pytest
import torch
from loss_cases import lora_model

from roll_lite.cli import main
from roll_lite.config import ConfigError, load_config
from roll_lite.data import DataProto
from roll_lite.loss.checker import TINY_MODEL
from roll_lite.loss.correction import rollout_importance_weights
from roll_lite.loss.mismatch import mismatch_metrics, mismatch_sums
from roll_lite.model.exact_decoding import exact_generate
from roll_lite.model.modeling import CausalLMWithLogProbs, build_causal_lm
from roll_lite.rollout.engine import SamplingParams
from roll_lite.rollout.hf import HFEngine
from roll_lite.runtime.metrics import reduce_metrics
from roll_lite.strategy.config import StrategyConfig
from roll_lite.strategy.micro_batches import forward_micro_batch, micro_batch_groups, select_micro_batch

REPO = Path(__file__).resolve().parents[1]
PAD, EOS = 0, 63
TEMPERATURE = 0.9
PARAMS = SamplingParams(max_new_tokens=8, num_samples=2, temperature=TEMPERATURE, top_k=20, top_p=0.95)
# how the actor may cut the rows: one padded micro-batch, several, packed, untrimmed padding (its LM head
# takes 7 tokens at a time, the engine's a whole batch of rows)
LAYOUTS = [
    dict(),
    dict(grad_accum_steps=3),
    dict(use_packing=True, grad_accum_steps=2),
    dict(trim_padding=False, grad_accum_steps=2),
]
PROMPTS = [[1 + (7 * i + j) % 60 for j in range(2 + i % 4)] for i in range(5)]


def engine_and_actor(lm: torch.nn.Module, exact: bool = True) -> tuple[HFEngine, torch.nn.Module]:
    actor = CausalLMWithLogProbs(copy.deepcopy(lm), chunk_size=7)
    return HFEngine(lm, PAD, EOS, seed=3, decode=exact_generate if exact else None), actor


def actor_log_probs(actor, sequences: list[list[int]], config: StrategyConfig, train: bool = False) -> torch.Tensor:
    """[rows, width] token-aligned log-probs of right-padded `sequences`, as the strategy computes them."""
    width = max(map(len, sequences))
    input_ids = torch.full((len(sequences), width), PAD)
    attention_mask = torch.zeros_like(input_ids)
    for i, sequence in enumerate(sequences):
        input_ids[i, : len(sequence)], attention_mask[i, : len(sequence)] = torch.tensor(sequence), 1
    data = DataProto({"input_ids": input_ids, "attention_mask": attention_mask}, meta_info={"temperature": TEMPERATURE})
    out = torch.zeros(input_ids.shape)
    actor.train(train)
    with torch.set_grad_enabled(train):
        for group in micro_batch_groups(data, config):
            log_probs = forward_micro_batch(actor, select_micro_batch(data, group, config), config, False)["log_probs"]
            out[group, : log_probs.shape[1]] = log_probs.detach()
    return out


def at(log_probs: torch.Tensor, spans: list[tuple[int, int]]) -> torch.Tensor:
    """[rows, longest span] values of each row's span (start, end), zero-padded; and the spans' mask."""
    width = max(end - start for start, end in spans)
    values, mask = torch.zeros(len(spans), width), torch.zeros(len(spans), width)
    for i, (start, end) in enumerate(spans):
        values[i, : end - start], mask[i, : end - start] = log_probs[i, start:end], 1
    return values, mask


def engine_values(completions_log_probs: list[list[float]]) -> torch.Tensor:
    width = max(map(len, completions_log_probs))
    return torch.tensor([row + [0.0] * (width - len(row)) for row in completions_log_probs])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_single_turn_log_probs_are_the_actors_bit_for_bit(dtype):
    engine, actor = engine_and_actor(build_causal_lm(TINY_MODEL, dtype=dtype, seed=0))
    completions = engine.generate(PROMPTS, PARAMS)
    rows = [prompt for prompt in PROMPTS for _ in range(PARAMS.num_samples)]
    sequences = [prompt + tokens for prompt, tokens in zip(rows, completions.token_ids)]
    spans = [(len(prompt), len(sequence)) for prompt, sequence in zip(rows, sequences)]
    sampled = engine_values(completions.log_probs)
    for layout in LAYOUTS:
        config = StrategyConfig(batch_invariant=True, **layout)
        trainer, mask = at(actor_log_probs(actor, sequences, config), spans)
        assert torch.equal(trainer, sampled), layout
    # the training forward (on-policy steps, rollout_bypass's ratio π_θ / π_engine): the same floats
    trainer, mask = at(actor_log_probs(actor, sequences, StrategyConfig(batch_invariant=True), train=True), spans)
    assert torch.equal(trainer, sampled)
    # so every TIS weight is exactly 1, and the mismatch metrics show no gap
    weights, capped = rollout_importance_weights(trainer, sampled, mask, "token", 2.0)
    assert torch.equal(weights, mask) and not capped.any()
    prefix = "rollout/mismatch/hf-float32"
    metrics = mismatch_metrics(reduce_metrics([mismatch_sums(sampled, trainer, mask, (0.9, 1.1))]), prefix)
    assert metrics[f"{prefix}/logp_gap_max"] == metrics[f"{prefix}/ratio_out_of_band"] == 0.0
    assert metrics[f"{prefix}/seq_kl_k3_max"] == 0.0 and metrics[f"{prefix}/tokens"] == mask.sum()


def test_the_default_mode_is_not_exact():
    """The same comparison without the mode: transformers' generate against the default forward."""
    engine, actor = engine_and_actor(build_causal_lm(TINY_MODEL, dtype=torch.float32, seed=0), exact=False)
    completions = engine.generate(PROMPTS, PARAMS)
    rows = [prompt for prompt in PROMPTS for _ in range(PARAMS.num_samples)]
    sequences = [prompt + tokens for prompt, tokens in zip(rows, completions.token_ids)]
    spans = [(len(prompt), len(sequence)) for prompt, sequence in zip(rows, sequences)]
    trainer, mask = at(actor_log_probs(actor, sequences, StrategyConfig(grad_accum_steps=3)), spans)
    gaps = (trainer - engine_values(completions.log_probs)).abs()[mask.bool()]
    assert 0 < gaps.max() < 1e-4  # the same distribution, other rounding


def test_multi_turn_trajectories_are_exact():
    """Turn 2 is generated after an environment's tokens, in another batch (fewer rows, other order, other
    padding); the actor scores each whole trajectory once."""
    engine, actor = engine_and_actor(build_causal_lm(TINY_MODEL, dtype=torch.float32, seed=0))
    params = SamplingParams(max_new_tokens=6, num_samples=1, temperature=TEMPERATURE)
    first = engine.generate(PROMPTS, params)
    contexts = [
        prompt + tokens + [40 + i] * (1 + i % 3) for i, (prompt, tokens) in enumerate(zip(PROMPTS, first.token_ids))
    ]
    order = [3, 0, 4, 1]  # the trajectory 2 ended: not in the second turn's batch
    second = engine.generate([contexts[i] for i in order], params)
    trajectories = [contexts[i] + tokens for i, tokens in zip(order, second.token_ids)]
    for layout in LAYOUTS:
        log_probs = actor_log_probs(actor, trajectories, StrategyConfig(batch_invariant=True, **layout))
        for row, i in enumerate(order):
            turn_1 = log_probs[row, len(PROMPTS[i]) : len(PROMPTS[i]) + len(first.token_ids[i])]
            turn_2 = log_probs[row, len(contexts[i]) : len(trajectories[row])]
            assert torch.equal(turn_1, torch.tensor(first.log_probs[i])), layout
            assert torch.equal(turn_2, torch.tensor(second.log_probs[row])), layout


def test_lora_is_exact():
    engine, actor = engine_and_actor(lora_model(torch.float32))
    completions = engine.generate(PROMPTS[:3], PARAMS)
    rows = [prompt for prompt in PROMPTS[:3] for _ in range(PARAMS.num_samples)]
    sequences = [prompt + tokens for prompt, tokens in zip(rows, completions.token_ids)]
    spans = [(len(prompt), len(sequence)) for prompt, sequence in zip(rows, sequences)]
    config = StrategyConfig(batch_invariant=True, use_packing=True, grad_accum_steps=2)
    trainer, _ = at(actor_log_probs(actor, sequences, config, train=True), spans)
    assert torch.equal(trainer, engine_values(completions.log_probs))


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["rollout.engine=vllm"], "rollout.exact"),
        (["rollout.dtype=bfloat16"], "rollout.dtype"),
        (["rollout.hf_static_cache=true"], "rollout.hf_static_cache"),
        (["workers.gpus_per_rank=1"], "workers.gpus_per_rank"),
        (["model.compile_layers=true"], "model.compile_layers"),
        (["actor.lora.rank=4", "actor.lora.dropout=0.1"], "actor.lora.dropout"),
    ],
)
def test_settings_that_break_the_exact_mode_are_config_errors(overrides, key):
    with pytest.raises(ConfigError, match=rf"^{key}: "):
        load_config(None, ["rollout.exact=true", *overrides])


def test_vllm_batch_invariance_needs_the_vllm_engine_on_a_gpu():
    with pytest.raises(ConfigError, match=r"^rollout.vllm_batch_invariant: .*GPU kernels"):
        load_config(None, ["rollout.vllm_batch_invariant=true"])
    with pytest.raises(ConfigError, match=r"^rollout.vllm_batch_invariant: "):
        load_config(None, ["rollout.vllm_batch_invariant=true", "rollout.engine=vllm"])


def _run_exact(tmp_path, config: str, overrides: list[str]) -> list[dict]:
    """roll-train in this process (workers.backend=local), tiny, with rollout.exact=true: its metrics records."""
    for name in ("train", "eval"):
        lines = (REPO / f"data/reverse_digits/{name}.jsonl").read_text().splitlines(keepends=True)[:4]
        (tmp_path / f"{name}.jsonl").write_text("".join(lines))
    tiny = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=2"]
    tiny += ["model.num_attention_heads=2", "model.num_key_value_heads=1", "sft.steps=0", "workers.torch_threads=1"]
    run = ["reward.functions={token_accuracy: 1.0}", "rollout.prompts_per_step=2", "rollout.num_samples=4"]
    run += ["eval_every=100", "workers.backend=local", "rollout.exact=true", "algorithm.rollout_is=token"]
    data = [f"data.train_files={tmp_path / 'train.jsonl'}", f"data.eval_files={tmp_path / 'eval.jsonl'}"]
    where = [f"output_dir={tmp_path}", "run_name=exact"]
    assert main(["--config", str(REPO / config), *tiny, *run, *data, *where, *overrides]) == 0
    return [json.loads(line) for line in (tmp_path / "exact/metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_run_in_exact_mode_logs_no_mismatch(tmp_path, dtype):
    """The wiring: roll-train with rollout.exact=true gives the actor the batch-invariant kernels and the
    engine its loop; every step's mismatch is 0, TIS weights 1. bfloat16: float32 master weights, the
    engine a bfloat16 copy of the parameters (its rotary buffers kept in float32, as the actor's)."""
    records = _run_exact(tmp_path, "configs/grpo.yaml", ["steps=2", f"actor.param_dtype={dtype}"])
    steps = [record for record in records if f"rollout/mismatch/hf-{dtype}/tokens" in record]
    assert len(steps) == 2
    for record in steps:
        assert record[f"rollout/mismatch/hf-{dtype}/tokens"] > 0
        assert record[f"rollout/mismatch/hf-{dtype}/logp_gap_max"] == 0.0
        assert record[f"rollout/mismatch/hf-{dtype}/ratio_out_of_band"] == 0.0
        assert record["actor/rollout_is_weight"] == 1.0 and record["actor/rollout_logp_gap_max"] == 0.0


def test_the_fully_async_mode_is_exact_for_the_current_weights_tokens(tmp_path):
    """Fully async (configs/grpo_async.yaml): a row started under the previous weights is resumed under the
    new ones from its prefix, decoded like a later turn. The tokens the current weights sampled agree with
    the actor's old log-probs bit for bit; the older tokens differ by what the update changed."""
    records = _run_exact(tmp_path, "configs/grpo_async.yaml", ["steps=4", "rollout.segment_tokens=3"])
    prefix = "rollout/mismatch/hf-float32"
    steps = [record for record in records if f"{prefix}/tokens" in record]
    assert len(steps) == 4
    for record in steps:
        assert record[f"{prefix}/current_weights/tokens"] > 0
        assert record[f"{prefix}/current_weights/logp_gap_max"] == 0.0
    older = [record for record in steps if record.get(f"{prefix}/older_weights/tokens", 0) > 0]
    assert older, "no step trained tokens of older weights: the test does not reach the async case"
    assert all(record[f"{prefix}/older_weights/logp_gap_max"] > 0 for record in older)
