"""A critic on a vision-language model (docs/vision.md, "A critic (and reward model) on a VLM"): PPO with GAE
(algorithm.advantage=gae) on image rows through roll-train, workers.backend=local, a tiny Qwen2.5-VL. The
critic's value head reads the VLM's final hidden states with the batch's images (roll_lite/model/vision_heads.py):
its forward fails when a row's image tokens come without their images (mrope_layout checks each sequence's
grids), so a run that trains two steps had them travel to it. Its exactness (the value loss and every gradient
with images, D = 1 and 2, packed) is in test_exactness_vision.py."""

from __future__ import annotations

import json
import math

import pytest
from PIL import Image
from roll_lite.pipelines.ppo import PPOPipeline
from test_vision_run import COLORS, REPO, ROWS, RUN

from roll_lite.rewards import CHEAP_REWARDS, REWARD_FUNCTIONS, register_reward
from roll_lite.strategy.vision_inputs import IMAGE_INPUTS

LENGTH = "test_vision_critic_length"


def response_length(response: str, ground_truth: str, extra: dict | None = None) -> float:
    return len(response) / 4


SEEN: dict[str, list[dict]] = {}  # run name -> per step: the batch the critic valued
RUNS = {"full": [], "lora": ["critic.lora.rank=2", "model.freeze_vision=true"]}  # a LoRA critic: adapters + head


class Recording(PPOPipeline):
    def step(self, step):
        metrics = super().step(step)
        batch = self.last_batch
        SEEN.setdefault(self.config.run_name, []).append(
            {"images": batch.non_tensor_batch.get(IMAGE_INPUTS), "values": batch["values"].clone()}
        )
        return metrics

    def compute_advantages(self, scores, token_rewards, batch):
        self.last_batch = batch
        return super().compute_advantages(scores, token_rewards, batch)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from roll_lite.cli import main

    folder = tmp_path_factory.mktemp("vision_critic")
    for (name, rgb), size in zip(COLORS.items(), [(16, 16), (24, 8), (16, 32)]):
        Image.new("RGB", size, rgb).save(folder / f"{name}.png")
    rows = [{"prompt": m, "images": images, "answer": answer} for m, images, answer in ROWS]
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    overrides = [o for o in RUN if not o.startswith(("pipeline=", "rollout.in_actor", "rollout.num_samples"))]
    overrides = [o for o in overrides if not o.startswith("reward.functions")] + ["checkpoint.enabled=false"]
    overrides += ["algorithm.track_kl=false", "rollout.max_new_tokens=4"]  # no reference: a cheaper run
    overrides += ["algorithm.advantage=gae", "critic.lr=1e-2", "rollout.num_samples=2"]
    overrides += [f"reward.functions={{{LENGTH}: 1.0}}"]  # non-zero returns
    overrides += ["pipeline=test_vision_critic:Recording", f"data.train_files={folder / 'train.jsonl'}"]
    register_reward(LENGTH, cheap=True)(response_length)  # scored in the driver: no guarded reward process
    try:
        for name, extra in RUNS.items():
            argv = [*overrides, f"output_dir={folder / 'out'}", f"run_name={name}", *extra]
            assert main(["--config", str(REPO / "configs/grpo.yaml"), *argv]) == 0
    finally:
        REWARD_FUNCTIONS.pop(LENGTH)
        CHEAP_REWARDS.discard(LENGTH)
    runs = {}
    for name in RUNS:
        lines = (folder / "out" / name / "metrics.jsonl").read_text().splitlines()
        runs[name] = [record for record in map(json.loads, lines) if record["step"] >= 1]
    return runs


@pytest.mark.parametrize("name", RUNS)
def test_gae_on_image_rows_trains_the_critic_with_the_images(run, name):
    records, seen = run[name], SEEN[name]
    assert len(records) == 2 and len(seen) == 2
    for record in records:
        assert math.isfinite(record["critic/vf_loss"]) and record["critic/vf_loss"] > 0
    assert all(any(entry is not None for entry in step["images"]) for step in seen)
    # the value head starts at zero: step 1 values every state 0, step 2 (after a critic step) does not
    assert seen[0]["values"].abs().max() == 0 and seen[1]["values"].abs().max() > 0


def test_the_score_head_on_a_vlm_reads_each_sequence_with_its_images():
    """VisionLMWithScoreHead (a reward model's head; the pipeline on image pairs is not built yet): through the
    strategy's packed forward, token t holds the score of the sequence ending at t, the plain HF trunk's over
    the padded batch with its images (float64); without the images' pixels (their tokens kept) it differs."""
    import torch
    from vision_cases import global_inputs, vision_batch, vision_lm

    from roll_lite.data import DataProto
    from roll_lite.model.vision_heads import VisionLMWithScoreHead
    from roll_lite.strategy import StrategyConfig
    from roll_lite.strategy.micro_batches import forward_micro_batch

    lm, data = vision_lm(), vision_batch()
    model = VisionLMWithScoreHead(lm, seed=3)
    scores = forward_micro_batch(model, data, StrategyConfig(use_packing=True), with_entropy=False)["scores"]
    attention = data["attention_mask"]
    with torch.no_grad():
        hidden = lm.model(**global_inputs(lm, data)).last_hidden_state
        valid = attention.bool()
        valid[:, 0] = False
        expected = torch.where(valid, hidden @ model.score.weight[0], 0.0)
    assert (scores - expected).abs().max() <= 1e-10 * expected.abs().max()
    blank = [
        None if e is None else {**e, "pixel_values": 0 * e["pixel_values"]} for e in data.non_tensor_batch[IMAGE_INPUTS]
    ]
    data = DataProto(data.batch, {IMAGE_INPUTS: blank})  # the cached batch's own entries stay as they are
    unseen = forward_micro_batch(model, data, StrategyConfig(use_packing=True), with_entropy=False)["scores"]
    assert (unseen - expected).abs().max() > 1e-6
