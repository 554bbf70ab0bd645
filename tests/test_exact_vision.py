"""rollout.exact and rollout.fully_async with images (docs/vision.md, "Exact and partial rollouts with images").

The exact decoding loop on a tiny float32 Qwen2.5-VL and Qwen3-VL (roll_lite/model/exact_vision.py): prompts of 1
and 2 images of different sizes and a text prompt, decoded together left-padded; the actor scores the finished
rows with the strategy's forward under the batch-invariant kernels, micro-batched, padded and packed otherwise:
the engine's log-probs are the actor's bit for bit. The negative controls: the loop with 1-D positions, or
recording the log-probs over the whole vocabulary, misses. Then a fully async GRPO run on image rows (partial
rollouts continued under new weights) in exact mode: the trained batch's ids and images are a fresh processor
call's, and the tokens of the current weights are the actor's bit for bit."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from roll_lite.data import DataProto
from roll_lite.model import exact_vision
from roll_lite.model.batch_invariant import batch_invariant_kernels
from roll_lite.model.exact_decoding import exact_generate
from roll_lite.model.qwen3_vl import build_qwen3_vl_processor, tiny_qwen3_vl_config
from roll_lite.model.vision import (
    VisionLMWithLogProbs,
    build_vision_model,
    build_vision_processor,
    encode_conversation,
    tiny_vision_config,
)
from roll_lite.model.vision_run import vision_token_ids
from roll_lite.rollout.engine import SamplingParams
from roll_lite.rollout.hf import HFEngine
from roll_lite.strategy.config import StrategyConfig
from roll_lite.strategy.micro_batches import forward_micro_batch, micro_batch_groups, select_micro_batch
from roll_lite.strategy.vision_inputs import IMAGE_INPUTS

REPO = Path(__file__).resolve().parents[1]
TEMPERATURE = 0.9
PARAMS = SamplingParams(max_new_tokens=6, num_samples=2, temperature=TEMPERATURE, top_k=30, top_p=0.95)
SIZES = [[(16, 16)], [(24, 8), (8, 8)], [], [(8, 16)]]  # per prompt its images (width, height)
LAYOUTS = [dict(), dict(grad_accum_steps=3), dict(use_packing=True, grad_accum_steps=2)]


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def vlm(request):
    """(processor, a float32 tiny VLM with its vision tokens excluded, the prompts' ids, their image inputs)."""
    make = build_qwen3_vl_processor if request.param == "qwen3_vl" else build_vision_processor
    processor = make(patch_size=4, merge_size=2, min_pixels=64, max_pixels=256)
    tiny = tiny_qwen3_vl_config if request.param == "qwen3_vl" else tiny_vision_config
    model = build_vision_model(tiny(processor), dtype=torch.float32, seed=0)
    model.excluded_token_ids = vision_token_ids(processor.tokenizer)
    pixels = np.random.default_rng(5)
    prompts, images = [], []
    for sizes in SIZES:
        pictures = [Image.fromarray(pixels.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]
        content = [{"type": "image"} for _ in pictures] + [{"type": "text", "text": "n?"}]
        encoded = encode_conversation(processor, [{"role": "user", "content": content}], pictures)
        prompts.append(encoded["input_ids"].tolist())
        images.append({k: encoded[k] for k in ("pixel_values", "image_grid_thw")} if pictures else None)
    return processor, model, prompts, images


def generate(vlm):
    processor, model, prompts, images = vlm
    tokenizer = processor.tokenizer
    engine = HFEngine(
        copy.deepcopy(model), tokenizer.pad_token_id, tokenizer.eos_token_id, seed=3, decode=exact_generate
    )
    completions = engine.generate(prompts, PARAMS, images=images)
    rows = [(prompt, entry) for prompt, entry in zip(prompts, images) for _ in range(PARAMS.num_samples)]
    return [(prompt, entry, tokens) for (prompt, entry), tokens in zip(rows, completions.token_ids)], completions


def actor_log_probs(model, rows, config: StrategyConfig, pad: int, train: bool = False) -> list[torch.Tensor]:
    """Each row's response log-probs as the strategy computes them (rows in reverse order: other neighbours)."""
    order = list(reversed(range(len(rows))))
    sequences = [rows[i][0] + rows[i][2] for i in order]
    width = max(map(len, sequences))
    input_ids, attention_mask = torch.full((len(rows), width), pad), torch.zeros(len(rows), width, dtype=torch.long)
    for i, sequence in enumerate(sequences):
        input_ids[i, : len(sequence)], attention_mask[i, : len(sequence)] = torch.tensor(sequence), 1
    data = DataProto({"input_ids": input_ids, "attention_mask": attention_mask}, meta_info={"temperature": TEMPERATURE})
    data.non_tensor_batch[IMAGE_INPUTS] = np.array([rows[i][1] for i in order], dtype=object)
    actor = VisionLMWithLogProbs(copy.deepcopy(model), chunk_size=7).train(train)
    out = torch.zeros(input_ids.shape)
    with torch.set_grad_enabled(train):
        for group in micro_batch_groups(data, config):
            log_probs = forward_micro_batch(actor, select_micro_batch(data, group, config), config, False)["log_probs"]
            out[group, : log_probs.shape[1]] = log_probs.detach()
    by_row = {i: out[k] for k, i in enumerate(order)}
    return [by_row[i][len(prompt) : len(prompt) + len(tokens)] for i, (prompt, _, tokens) in enumerate(rows)]


def test_exact_log_probs_with_images_are_the_actors_bit_for_bit(vlm):
    processor, model, _, images = vlm
    rows, completions = generate(vlm)
    assert any(entry is not None and len(entry["image_grid_thw"]) == 2 for _, entry, _ in rows)
    excluded = set(model.excluded_token_ids)
    assert not any(excluded & set(tokens) for _, _, tokens in rows)  # the vision tokens never sampled
    pad = processor.tokenizer.pad_token_id
    for layout in LAYOUTS:
        trainer = actor_log_probs(model, rows, StrategyConfig(batch_invariant=True, **layout), pad)
        for row, (values, engine) in enumerate(zip(trainer, completions.log_probs)):
            assert torch.equal(values, torch.tensor(engine)), (layout, row)
    trainer = actor_log_probs(model, rows, StrategyConfig(batch_invariant=True), pad, train=True)
    assert all(torch.equal(v, torch.tensor(e)) for v, e in zip(trainer, completions.log_probs))
    # the vision tower under the kernels: an image's features are the same alone and beside other images
    with torch.no_grad(), batch_invariant_kernels():
        both = [e for e in images if e is not None]
        together = model.model.get_image_features(
            torch.cat([e["pixel_values"] for e in both]), torch.cat([e["image_grid_thw"] for e in both])
        ).pooler_output
        alone = model.model.get_image_features(both[-1]["pixel_values"], both[-1]["image_grid_thw"]).pooler_output
    assert torch.equal(together[-1], alone[0])


def test_the_loops_positions_are_transformers_rope_index_then_its_rope_deltas(vlm):
    """The prefill's 3-row positions are transformers' get_rope_index of the left-padded batch on its tokens, and
    each decoded token's are what transformers' generate gives it (compute_3d_position_ids with the cache:
    attention-mask positions + rope_deltas)."""
    processor, model, prompts, images = vlm
    width = max(map(len, prompts))
    input_ids = torch.full((len(prompts), width), processor.tokenizer.pad_token_id)
    attention_mask = torch.zeros_like(input_ids)
    for i, prompt in enumerate(prompts):
        input_ids[i, width - len(prompt) :], attention_mask[i, width - len(prompt) :] = torch.tensor(prompt), 1
    positions, _ = exact_vision.prefill_inputs(model, input_ids, attention_mask, images, samples=1)
    grids = torch.cat([e["image_grid_thw"] for e in images if e is not None])
    kinds = (input_ids == model.config.image_token_id).int()
    theirs = model.model
    theirs.rope_deltas = None
    options = dict(input_ids=input_ids, image_grid_thw=grids, video_grid_thw=None, mm_token_type_ids=kinds)
    prefill = theirs.compute_3d_position_ids(
        inputs_embeds=torch.empty(*input_ids.shape, 1), attention_mask=attention_mask, past_key_values=None, **options
    )
    assert torch.equal(positions[:, attention_mask.bool()], prefill[:, attention_mask.bool()])

    class Cache:  # what compute_3d_position_ids reads of the KV cache
        def __init__(self, length):
            self.length = length

        def get_seq_length(self):
            return self.length

    for step in range(3):
        positions = exact_vision.next_positions(positions)
        attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)
        decode = theirs.compute_3d_position_ids(
            inputs_embeds=torch.empty(len(prompts), 1, 1),
            attention_mask=attention_mask,
            past_key_values=Cache(width + step),
            **options,
        )
        assert torch.equal(positions, decode[..., -1:]), step
    theirs.rope_deltas = None


def test_1d_positions_or_the_whole_vocabulary_miss(vlm, monkeypatch):
    processor, model, _, _ = vlm
    pad = processor.tokenizer.pad_token_id
    config = StrategyConfig(batch_invariant=True)

    def gaps(with_images_only: bool) -> float:
        rows, completions = generate(vlm)
        trainer = actor_log_probs(model, rows, config, pad)
        return max(
            (values - torch.tensor(engine)).abs().max().item()
            for values, engine, (_, entry, _) in zip(trainer, completions.log_probs, rows)
            if entry is not None or not with_images_only
        )

    with monkeypatch.context() as patch:  # text positions for the image tokens too, as a 1-D loop would have
        patch.setattr(exact_vision, "prompt_positions", lambda model, ids, grid: torch.arange(len(ids)))
        assert gaps(with_images_only=True) > 1e-6
    with monkeypatch.context() as patch:
        patch.setattr(exact_vision, "excluded_ids", lambda model: [])
        assert gaps(with_images_only=False) > 1e-6


def test_partial_rollouts_keep_each_prompts_images_and_their_state():
    """Continuation requests carry each row's prompt images, also after the cohort's JSON state is loaded with its
    images handed back."""
    from roll_lite.rollout import Completions
    from roll_lite.rollout.partial import PartialRollouts

    images = [
        {"pixel_values": torch.rand(8, 48) / 3, "image_grid_thw": torch.tensor([[1, 2, 4]])},
        None,
        {"pixel_values": torch.rand(4, 48), "image_grid_thw": torch.tensor([[1, 2, 2]])},
    ]
    calls = []

    def generate(prompts, params, images):
        calls.append((prompts, images))
        rows = [p for p in prompts for _ in range(params.num_samples)]
        return Completions([[7] * params.max_new_tokens for _ in rows], [[-0.5] * params.max_new_tokens for _ in rows])

    partial = PartialRollouts(eos_token_id=99)
    partial.admit(1, [[1], [2, 2], [3]], SamplingParams(max_new_tokens=4, num_samples=2), "continue", images)
    partial.advance(1, 2, version=0, generate=generate)
    saved = json.loads(json.dumps(partial.state_dict()))
    assert "pixel_values" not in json.dumps(saved)  # the pixels are the data rows': handed back at load
    with pytest.raises(RuntimeError, match="cohort 1 was admitted with images; none given to load"):
        PartialRollouts(eos_token_id=99).load_state_dict(saved)
    resumed = PartialRollouts(eos_token_id=99)
    resumed.load_state_dict(saved, {1: images})
    resumed.advance(1, 2, version=1, generate=generate)
    assert calls[0][1] is images and len(calls[1][0]) == 6  # fresh: per prompt; then per row
    for row, entry in enumerate(calls[1][1]):  # the continuation: per row, its prompt's images
        expected = images[row // 2]
        assert (entry is None) == (expected is None)
        if entry is not None:
            assert entry is expected
    assert resumed.take(1).token_versions == [[0, 0, 1, 1]] * 6
    with pytest.raises(ValueError, match="2 image entries for 3 prompts"):
        PartialRollouts(99).admit(2, [[1], [2], [3]], SamplingParams(4, 2), "continue", images[:2])


from roll_lite.pipelines.ppo import PPOPipeline  # noqa: E402  (the recording pipeline's base)

BATCHES: list[DataProto] = []


class Recording(PPOPipeline):
    def collect_rollout(self, step):
        batch, behind = super().collect_rollout(step)
        BATCHES.append(batch)
        return batch, behind


COLORS = {"red": ((16, 16), (255, 0, 0)), "green": ((24, 8), (0, 200, 0)), "blue": ((16, 32), (0, 0, 255))}
ROWS = [(["red"], "red"), (["green", "blue"], "blue"), (["blue"], "blue"), (["red", "green"], "no")]  # images, answer
TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=2"]
TINY += ["model.num_attention_heads=2", "model.num_key_value_heads=1", "model.max_position_embeddings=128"]
RUN = ["sft.steps=0", "workers.backend=local", "workers.torch_threads=1", "rollout.prompts_per_step=2"]
RUN += ["rollout.num_samples=2", "rollout.max_new_tokens=6", "rollout.exact=true", "actor.lr=1e-2", "save_model=false"]
RUN += ["reward.functions={token_accuracy: 1.0}", "algorithm.entropy_coef=0.01", "eval_every=100"]


def prompt(files: list[str]) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"} for _ in files] + [{"type": "text", "text": "color?"}]}]


def image_rows(folder: Path) -> list[str]:
    """ROWS' images and data file in `folder`: the run's data keys."""
    for name, (size, rgb) in COLORS.items():
        Image.new("RGB", size, rgb).save(folder / f"{name}.png")
    lines = [json.dumps({"prompt": prompt(f), "images": [x + ".png" for x in f], "answer": a}) for f, a in ROWS]
    (folder / "train.jsonl").write_text("\n".join(lines) + "\n")
    return ["data.image_key=images", "data.max_prompt_length=100", "data.eval_files=[]"] + [
        f"data.train_files={folder / 'train.jsonl'}"
    ]


def run_metrics(folder: Path) -> list[dict]:
    """The run's step records, without their timings."""
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in records if "actor/pg_loss" in r]


def test_a_fully_async_exact_run_on_image_rows(tmp_path):
    """configs/grpo_async.yaml on image rows with rollout.exact: rows started under old weights go on under
    new ones with their images; every trained sample's ids and images are a fresh processor call's, the
    current weights' tokens are the actor's bit for bit and the older ones' are not. Resumed from step 2's
    checkpoint (cohort 3 half generated; its images handed back from the data rows), step 3 is the same."""
    from roll_lite.cli import main
    from roll_lite.model.vision_run import run_processor

    run = ["model.model_type=qwen2_5_vl", *TINY, *RUN, *image_rows(tmp_path), "rollout.segment_tokens=3", "steps=3"]
    run += ["pipeline=test_exact_vision:Recording", "checkpoint.every=2", "checkpoint.keep_last=null"]
    config = ["--config", str(REPO / "configs/grpo_async.yaml"), *run, f"output_dir={tmp_path}"]
    BATCHES.clear()
    assert main([*config, "run_name=async"]) == 0
    steps = run_metrics(tmp_path / "async")
    in_flight = json.loads((tmp_path / "async/checkpoints/step_2/rollouts_in_flight.json").read_text())
    assert in_flight["partial"]["3"]["with_images"] and any(r["tokens"] for r in in_flight["partial"]["3"]["rows"])
    assert main([*config, "run_name=resumed", f"resume={tmp_path / 'async/checkpoints/step_2'}"]) == 0
    assert run_metrics(tmp_path / "resumed")[-1] == steps[-1]
    assert len(steps) == 3 and all(np.isfinite(r["actor/pg_loss"]) for r in steps)
    prefix = "rollout/mismatch/hf-float32"
    assert all(r[f"{prefix}/current_weights/logp_gap_max"] == 0.0 for r in steps)
    older = [r for r in steps if r.get(f"{prefix}/older_weights/tokens", 0) > 0]
    assert older and all(r[f"{prefix}/older_weights/logp_gap_max"] > 0 for r in older)  # continued rows
    fresh = run_processor()
    pictures = {name: Image.open(tmp_path / f"{name}.png").convert("RGB") for name in COLORS}
    by_row = {(json.dumps(prompt(f)), a): f for f, a in ROWS}
    for batch in BATCHES:
        for row in range(len(batch)):
            files = by_row[json.dumps(batch.non_tensor_batch["prompt"][row]), batch.non_tensor_batch["answer"][row]]
            expected = encode_conversation(fresh, prompt(files), [pictures[f] for f in files])
            start = int(batch["response_mask"][row].argmax())
            entry = batch.non_tensor_batch[IMAGE_INPUTS][row]
            assert torch.equal(batch["input_ids"][row, :start], expected["input_ids"])
            assert torch.equal(entry["pixel_values"], expected["pixel_values"])
            assert torch.equal(entry["image_grid_thw"], expected["image_grid_thw"])


def test_an_exact_bfloat16_qwen3_vl_run_on_image_rows_logs_no_mismatch(tmp_path):
    """The wiring of the lockstep run: bfloat16 parameters (float32 buffers on both sides), Qwen3-VL's DeepStack."""
    from roll_lite.cli import main

    run = ["model.model_type=qwen3_vl", *TINY, *RUN, *image_rows(tmp_path), "steps=2", "actor.param_dtype=bfloat16"]
    run += ["algorithm.rollout_is=token", "checkpoint.enabled=false", f"output_dir={tmp_path}", "run_name=bf16"]
    assert main(["--config", str(REPO / "configs/grpo.yaml"), *run]) == 0
    steps = run_metrics(tmp_path / "bf16")
    assert len(steps) == 2
    for r in steps:
        assert r["rollout/mismatch/hf-bfloat16/tokens"] > 0 and r["rollout/mismatch/hf-bfloat16/logp_gap_max"] == 0.0
        assert r["actor/rollout_is_weight"] == 1.0 and np.isfinite(r["actor/pg_loss"])


def test_a_multi_turn_exact_run_with_images_in_turns_1_and_3(tmp_path):
    """color_cards on the tiny Qwen2.5-VL with rollout.exact: turn 3 is decoded from a prompt holding turn 1's
    image, the answers so far and turn 3's image, in another batch; the actor scores each whole trajectory once
    with both images. Every sampled token's log-prob is the actor's bit for bit."""
    from roll_lite.cli import main

    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"seed": s}) + "\n" for s in (1, 3)))
    env = ["environment.name=color_cards", "environment.max_turns=3", "environment.max_new_tokens_per_turn=4"]
    env += ["environment.max_trajectory_tokens=100", "environment.max_concurrent=1"]
    run = ["pipeline=roll_lite.pipelines.multi_turn:MultiTurnPipeline", "rollout.exact=true", "sft.steps=0"]
    run += ["workers.backend=local", "workers.torch_threads=1", "rollout.prompts_per_step=2", "rollout.num_samples=2"]
    run += ["algorithm.entropy_coef=0.01", "actor.lr=1e-2", "steps=2", "eval_every=100", "save_model=false"]
    run += ["checkpoint.enabled=false", "data.eval_files=[]", "model.model_type=qwen2_5_vl", *TINY]
    where = [f"data.train_files={tmp_path / 'rows.jsonl'}", f"output_dir={tmp_path}", "run_name=cards"]
    assert main(["--config", str(REPO / "configs/grpo.yaml"), *env, *run, *where]) == 0
    steps = run_metrics(tmp_path / "cards")
    assert len(steps) == 2
    for r in steps:
        assert r["env/turns"] == 3.0 and r["rollout/mismatch/hf-float32/tokens"] > 0
        assert r["rollout/mismatch/hf-float32/logp_gap_max"] == 0.0 and r["actor/rollout_logp_gap_max"] == 0.0
