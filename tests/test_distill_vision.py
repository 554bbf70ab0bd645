"""Distillation teachers on image prompts (docs/vision.md; roll_lite/model/vision_teacher.py): a tiny Qwen2.5-VL
student built from the `model` keys distils two steps of roll-train (workers.backend=local,
distill.signal=top_k_forward_kl) from a tiny Qwen2.5-VL teacher saved as a folder. The teacher's log-probs and top k
on the trained tokens are a direct forward of the folder's model (transformers' own, full logits) on the same ids
with the same images, over the vocabulary without the vision tokens; without the images they differ (the negative
control). The student's log-probs of the teacher's ids are its restricted ones, and a teacher folder whose
processor reads the pixels otherwise stops the run before it starts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image
from roll_lite.pipelines.ppo import PPOPipeline
from tiny_vlm import TINY_VLM

from roll_lite.config import ConfigError, load_config
from roll_lite.model.vision import VisionLMWithLogProbs, build_vision_model
from roll_lite.model.vision_run import run_processor, vision_config, vision_token_ids

REPO = Path(__file__).resolve().parents[1]
SIZES = [*TINY_VLM]
PROMPT = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "color?"}]}]
TOP_K = 4
SCORED: list[tuple] = []  # per step: the batch the teacher scored, its outputs


class Recording(PPOPipeline):
    """Each step's batch as the teachers got it, and what they returned."""

    def __init__(self, config):
        super().__init__(config)
        assert self.teachers is not None
        scores = self.teachers.scores

        def recorded(batch):
            outputs = scores(batch)
            SCORED.append((batch, outputs))
            return outputs

        self.teachers.scores = recorded


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from roll_lite.cli import main

    root = tmp_path_factory.mktemp("distill_vision")
    teacher = root / "teacher"
    build_vision_model(vision_config(load_config(None, SIZES).model), seed=3).save_pretrained(teacher)
    run_processor(SimpleNamespace(min_pixels=64, max_pixels=512)).save_pretrained(teacher)
    for name, size in (("red", (16, 16)), ("blue", (24, 8))):
        Image.new("RGB", size, {"red": (255, 0, 0), "blue": (0, 0, 255)}[name]).save(root / f"{name}.png")
    rows = [{"prompt": PROMPT, "images": [f"{name}.png"], "answer": name} for name in ("red", "blue")]
    (root / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    overrides = [
        *SIZES,
        "sft.steps=0",
        "workers.backend=local",
        "workers.torch_threads=1",
        "rollout.prompts_per_step=2",
        "rollout.num_samples=2",
        "rollout.max_new_tokens=4",
        "rollout.temperature=0.9",
        "reward.functions={token_accuracy: 1.0}",
        "actor.lr=1e-2",
        "data.image_key=images",
        "data.max_prompt_length=100",
        f"data.train_files={root / 'train.jsonl'}",
        "data.eval_files=[]",
        f"distill.teacher={teacher}",
        "distill.signal=top_k_forward_kl",
        f"distill.top_k={TOP_K}",
        "steps=2",
        "eval_every=100",
        "save_model=false",
        "checkpoint.enabled=false",
        f"output_dir={root / 'out'}",
        "run_name=distilled",
        "pipeline=test_distill_vision:Recording",
    ]
    SCORED.clear()
    assert main(["--config", str(REPO / "configs/grpo.yaml"), *overrides]) == 0
    lines = (root / "out" / "distilled" / "metrics.jsonl").read_text().splitlines()
    metrics = [record for record in map(json.loads, lines) if record["step"] >= 1]
    return SimpleNamespace(root=root, teacher=teacher, overrides=overrides, metrics=metrics)


def direct(model, ids, images, temperature, excluded):
    """log softmax of transformers' own forward (full logits) over the vocabulary without `excluded`, [L, V]; with
    images, the processor's mm_token_type_ids (1 on the image tokens), from which it lays out M-RoPE itself."""
    seen = {} if images is None else {**images, "mm_token_type_ids": (ids == model.config.image_token_id).long()[None]}
    with torch.no_grad():
        logits = model(input_ids=ids[None], **seen).logits[0].double() / temperature
    logits[:, excluded] = float("-inf")
    return torch.log_softmax(logits, -1)


def test_the_teachers_scores_are_a_direct_forward_with_the_samples_images_and_differ_without(run):
    from transformers import Qwen2_5_VLForConditionalGeneration

    teacher = Qwen2_5_VLForConditionalGeneration.from_pretrained(run.teacher, dtype=torch.float32).eval()
    excluded = vision_token_ids(run_processor().tokenizer)
    assert len(SCORED) == 2 and all(record["actor/distill_kl"] > 0 for record in run.metrics)
    blind_gaps = []
    for batch, outputs in SCORED:
        temperature = batch.meta_info["temperature"]
        assert temperature == 0.9
        for row in range(len(batch)):
            kept = batch["attention_mask"][row].bool()
            ids, images = batch["input_ids"][row][kept], batch.non_tensor_batch["image_inputs"][row]
            assert images is not None and (ids == teacher.config.image_token_id).sum() > 0
            trained = batch["response_mask"][row][kept].bool()
            trained[0] = False
            positions = trained.nonzero()[:, 0]  # token p is predicted at p - 1
            seen = direct(teacher, ids, images, temperature, excluded)[positions - 1]
            scored = outputs["teacher_log_probs"][row][kept][positions].double()
            torch.testing.assert_close(scored, seen.gather(1, ids[positions, None])[:, 0], rtol=0, atol=1e-6)
            top = seen.topk(TOP_K, dim=-1)
            assert torch.equal(outputs["teacher_top_k_ids"][row][kept][positions], top.indices)
            top_scored = outputs["teacher_top_k_log_probs"][row][kept][positions].double()
            torch.testing.assert_close(top_scored, top.values, rtol=0, atol=1e-6)
            blind = direct(teacher, ids, None, temperature, excluded)[positions - 1]
            blind_gaps.append((scored - blind.gather(1, ids[positions, None])[:, 0]).abs().max())
    assert min(blind_gaps) > 1e-3  # without the images the teacher scores otherwise, on every row


def test_the_students_log_probs_of_the_teachers_ids_are_its_restricted_ones(run):
    """The head's top k and its log-probs of given ids (a student's) agree, and the sampled token's stay the same."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(run.teacher, dtype=torch.float32).eval()
    model.excluded_token_ids = vision_token_ids(run_processor().tokenizer)
    batch, _ = SCORED[0]
    kept = batch["attention_mask"][0].bool()
    ids, images = batch["input_ids"][0][kept][None], batch.non_tensor_batch["image_inputs"][0]
    head, positions = VisionLMWithLogProbs(model, chunk_size=7), torch.arange(ids.shape[1])[None]
    with torch.no_grad():
        plain = head(ids, positions, **images)
        top = head(ids, positions, **images, top_k=TOP_K)
        gathered = head(ids, positions, **images, gather_ids=top["top_k_ids"])
    assert torch.equal(top["log_probs"], plain["log_probs"]) and torch.equal(gathered["log_probs"], plain["log_probs"])
    torch.testing.assert_close(gathered["top_k_log_probs"], top["top_k_log_probs"], rtol=0, atol=1e-6)
    assert not set(top["top_k_ids"].unique().tolist()) & set(model.excluded_token_ids)


def test_a_teacher_folder_that_reads_the_pixels_otherwise_stops_the_run_before_it_starts(run, tmp_path):
    from roll_lite.pipelines.teachers import Teachers

    from roll_lite.model.vision_folder import image_processor_settings

    other = tmp_path / "teacher"
    shutil.copytree(run.teacher, other)
    settings, name = image_processor_settings(other)
    settings["image_mean"] = [0.5, 0.5, 0.5]
    whole = json.loads((other / name).read_text())
    (other / name).write_text(
        json.dumps({**whole, "image_processor": settings} if "image_processor" in whole else settings)
    )
    overrides = [o for o in run.overrides if not o.startswith(("distill.teacher=", "pipeline="))]
    config = load_config(str(REPO / "configs/grpo.yaml"), [*overrides, f"distill.teacher={other}"])
    with pytest.raises(
        ConfigError, match=r"distill.teacher: the teacher \('.*'\) differs from the student: the image "
    ):
        Teachers(config).check(run_processor().tokenizer)


def test_teacher_top_k_under_sequence_parallelism_is_a_config_error_naming_the_key(run):
    overrides = [o for o in run.overrides if not o.startswith("pipeline=")]
    with pytest.raises(ConfigError, match=r"distill.signal: top_k_forward_kl with a vision-language model"):
        load_config(str(REPO / "configs/grpo.yaml"), [*overrides, "actor.sequence_parallel=2", "workers.actor_dp=2"])
