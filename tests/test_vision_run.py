"""GRPO on image rows through roll-train (docs/vision.md): a tiny Qwen2.5-VL built from the `model` keys
(model.model_type=qwen2_5_vl; once a tiny Qwen3-VL, model.model_type=qwen3_vl), prompts rendered by the processor in the driver, the hf engine generating from
each prompt's images, the batch carrying them (non_tensor_batch["image_inputs"]) to the trainer, and the
weight sync of the vision tower when it trains (model.freeze_vision=false) and not when frozen.

The runs are in this process (workers.backend=local, the engine a worker of its own: rollout.in_actor=false, so
that the weights travel) with a pipeline that records each step's batch and, after the step's sync, the
vision tower's weights in the actor and in the engine. The vision tokens are never sampled: the engine masks
them, and the trainer normalises over the same vocabulary (roll_lite/model/restricted_vocab.py), which the
first two tests check alone.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch
import warm_driver
from PIL import Image
from roll_lite.pipelines.ppo import PPOPipeline
from tiny_vlm import TINY_VLM

from roll_lite.model.restricted_vocab import restricted_log_probs
from roll_lite.model.vision import VisionLMWithLogProbs, build_vision_model, encode_conversation, tiny_vision_config
from roll_lite.model.vision_run import run_processor, vision_token_ids
from roll_lite.rollout import SamplingParams
from roll_lite.rollout.hf import HFEngine

REPO = Path(__file__).resolve().parents[1]
COLORS = {"red": (255, 0, 0), "green": (0, 200, 0), "blue": (0, 0, 255)}


def messages(*parts: str) -> list[dict]:
    content = [{"type": "image"} if part == "<image>" else {"type": "text", "text": part} for part in parts]
    return [{"role": "user", "content": content}]


# (messages, image files, answer): one and two images, of different sizes (4 to 8 image tokens each)
ROWS = [
    (messages("<image>", "color?"), ["red.png"], "red"),
    (messages("which ", "<image>", " or ", "<image>", "?"), ["green.png", "blue.png"], "blue"),
    (messages("<image>", "color?"), ["blue.png"], "blue"),
    (messages("<image>", "<image>", "same?"), ["red.png", "green.png"], "no"),
]
MODEL = [*TINY_VLM]
RUN = [
    *MODEL,
    "sft.steps=0",
    "workers.backend=local",
    "workers.torch_threads=1",
    "rollout.in_actor=false",
    "rollout.prompts_per_step=2",
    "rollout.num_samples=4",
    "rollout.max_new_tokens=6",
    "reward.functions={token_accuracy: 1.0}",
    "algorithm.entropy_coef=0.01",  # a gradient every step, whatever the rewards
    "actor.lr=1e-2",
    "data.image_key=images",
    "data.max_prompt_length=100",
    "data.eval_files=[]",
    "steps=2",
    "eval_every=100",
    "save_model=false",
    "pipeline=test_vision_run:Recording",
]
RECORDS: dict[str, list[dict]] = {}  # run name -> per step: its batch, the vision weights after its sync
# the one-process runs: name -> (its overrides, its model family)
RUNS = {
    "trained": ([], "qwen2_5_vl"),
    "frozen": (["model.freeze_vision=true"], "qwen2_5_vl"),
    "qwen3": (["model.model_type=qwen3_vl"], "qwen3_vl"),
}


def vision_part(state: dict) -> dict:
    return {name: value.clone() for name, value in state.items() if name.startswith("model.visual.")}


class Recording(PPOPipeline):
    """Each step's batch as collected, and after the step's weight sync the vision tower of the actor and of
    the engine."""

    def collect_rollout(self, step):
        batch, behind = super().collect_rollout(step)
        RECORDS.setdefault(self.config.run_name, []).append({"batch": batch})
        return batch, behind

    def step(self, step):
        from roll_lite.model.weights import unflatten_state_dict

        metrics = super().step(step)
        self.schedule.wait_sync()
        assert self.rollout is not None
        record = RECORDS[self.config.run_name][-1]
        record["engine"] = vision_part(self.rollout.weights()[1])
        record["actor"] = vision_part(unflatten_state_dict(self.actor.state_dict_ref()))
        return metrics


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Images made with Pillow and a JSONL of ROWS in a folder of their own."""
    folder = tmp_path_factory.mktemp("vision")
    for (name, rgb), size in zip(COLORS.items(), [(16, 16), (24, 8), (16, 32)]):
        Image.new("RGB", size, rgb).save(folder / f"{name}.png")
    rows = [{"prompt": m, "images": images, "answer": answer} for m, images, answer in ROWS]
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


@pytest.fixture(scope="module")
def runs(data):
    from roll_lite.cli import main

    common = [*RUN, f"data.train_files={data / 'train.jsonl'}", f"output_dir={data / 'out'}"]
    for name, (extra, _) in RUNS.items():
        assert main(["--config", str(REPO / "configs/grpo.yaml"), *common, f"run_name={name}", *extra]) == 0
    return data


def metrics(folder, name):
    lines = (folder / "out" / name / "metrics.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record["step"] >= 1]


def initial_vision(model_type: str = "qwen2_5_vl"):
    """The vision tower every run starts from: the model keys' build, seeded by the run's seed (0)."""
    from roll_lite.config import load_config
    from roll_lite.model.vision_run import load_vision_lm

    config = load_config(None, [*MODEL, f"model.model_type={model_type}"])
    return vision_part(load_vision_lm(config.model, seed=config.seed).state_dict())


def test_each_step_trains_and_the_engine_log_probs_are_the_trainers(runs):
    for name in RUNS:
        records = metrics(runs, name)
        assert [r["step"] for r in records] == [1, 2]
        for r in records:
            assert torch.isfinite(torch.tensor(r["actor/pg_loss"])) and r["actor/grad_norm"] > 0
            assert r["actor/rollout_logp_gap"] < 1e-5 and r["actor/rollout_logp_gap_max"] < 1e-5, r


def test_the_ids_trained_on_are_a_fresh_processor_call_with_each_image_once(runs):
    """Every sample: its prompt ids and image inputs are those of a fresh processor on its row, its image
    tokens exactly its images' (none sampled), and its response holds no vision token. Qwen3-VL's processor
    normalises the pixels otherwise (mean = std = 0.5): its run's pixel_values are not Qwen2.5-VL's."""
    images = {name: Image.open(runs / f"{name}.png").convert("RGB") for name in COLORS}
    by_row = {(json.dumps(m), answer): (m, files) for m, files, answer in ROWS}
    steps = [(step, run_processor(model_type=family)) for name, (_, family) in RUNS.items() for step in RECORDS[name]]
    for step, fresh in steps:
        image_token, vision_ids = fresh.image_token_id, set(vision_token_ids(fresh.tokenizer))
        batch = step["batch"]
        inputs = batch.non_tensor_batch["image_inputs"]
        for row in range(len(batch)):
            nt = batch.non_tensor_batch
            m, files = by_row[json.dumps(nt["prompt"][row]), nt["answer"][row]]
            expected = encode_conversation(fresh, m, [images[f.removesuffix(".png")] for f in files])
            start = int(batch["response_mask"][row].argmax())
            length = int(batch["attention_mask"][row].sum())
            assert torch.equal(batch["input_ids"][row, :start], expected["input_ids"])
            assert torch.equal(inputs[row]["pixel_values"], expected["pixel_values"])
            assert torch.equal(inputs[row]["image_grid_thw"], expected["image_grid_thw"])
            held = int((batch["input_ids"][row, :length] == image_token).sum())
            assert held == int(expected["image_grid_thw"].prod(-1).sum()) // 4 > 0  # merge 2 × 2
            assert not vision_ids & set(batch["input_ids"][row, start:length].tolist())
    qwen3 = RECORDS["qwen3"][0]["batch"]
    m, files = by_row[json.dumps(qwen3.non_tensor_batch["prompt"][0]), qwen3.non_tensor_batch["answer"][0]]
    other = encode_conversation(run_processor(), m, [images[f.removesuffix(".png")] for f in files])
    assert not torch.equal(qwen3.non_tensor_batch["image_inputs"][0]["pixel_values"], other["pixel_values"])


def test_a_trained_vision_tower_changes_and_is_synced_a_frozen_one_stays(runs):
    """Qwen3-VL's tower includes its learned position embeddings and DeepStack mergers."""
    for run in ("trained", "qwen3"):
        start = initial_vision(RUNS[run][1])
        for step in RECORDS[run]:
            assert step["engine"].keys() == step["actor"].keys() == start.keys()
            for name, value in step["actor"].items():
                torch.testing.assert_close(step["engine"][name], value, rtol=0, atol=0)
        changed = [name for name, value in RECORDS[run][-1]["actor"].items() if not torch.equal(value, start[name])]
        assert len(changed) > len(start) // 2
        if run == "qwen3":
            assert {"model.visual.pos_embed.weight", "model.visual.deepstack_merger_list.0.linear_fc2.weight"} <= set(
                changed
            )
    start = initial_vision()
    for step in RECORDS["frozen"]:
        for name, value in start.items():
            assert torch.equal(step["actor"][name], value) and torch.equal(step["engine"][name], value)


@pytest.fixture(scope="module")
def policy():
    processor = run_processor()
    model = build_vision_model(tiny_vision_config(processor), seed=0)
    return processor, model, vision_token_ids(processor.tokenizer)


def test_the_engine_never_samples_a_vision_token_and_records_the_restricted_log_probs(policy):
    """A random tiny VLM samples vision tokens (the control); with them excluded it samples none, and the
    policy head with the same excluded ids gives the engine's log-probs (without them it would not)."""
    processor, model, excluded = policy
    tokenizer = processor.tokenizer
    encoded = encode_conversation(processor, messages("<image>", "color?"), [Image.new("RGB", (16, 16), (9, 9, 9))])
    images = [{key: encoded[key] for key in ("pixel_values", "image_grid_thw")}]
    prompt, params = encoded["input_ids"].tolist(), SamplingParams(max_new_tokens=8, num_samples=8)

    def sample(exclude):
        engine = HFEngine(model, tokenizer.pad_token_id, tokenizer.eos_token_id, seed=1, excluded_token_ids=exclude)
        return engine.generate([prompt], params, images=images)

    assert any(set(excluded) & set(ids) for ids in sample(None).token_ids)  # the control
    completions = sample(excluded)
    assert not any(set(excluded) & set(ids) for ids in completions.token_ids)
    head = VisionLMWithLogProbs(model)
    for response, engine_log_probs in zip(completions.token_ids, completions.log_probs):
        ids = torch.tensor([prompt + response])
        positions = torch.arange(ids.shape[1])[None]
        gathered = {}
        for restricted in (True, False):
            model.excluded_token_ids = excluded if restricted else None
            with torch.no_grad():
                out = head(ids, positions, attention_mask=torch.ones_like(ids), **images[0])["log_probs"]
            gathered[restricted] = out[0, len(prompt) - 1 : -1]
        torch.testing.assert_close(gathered[True], torch.tensor(engine_log_probs), rtol=0, atol=1e-5)
        assert (gathered[False] - gathered[True]).abs().max() > 1e-3
    model.excluded_token_ids = None


def test_restricted_log_probs_are_a_masked_softmax_and_finite_at_an_excluded_target():
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(12, 8, dtype=torch.float64, generator=generator, requires_grad=True)
    weight = torch.randn(20, 8, dtype=torch.float64, generator=generator, requires_grad=True)
    excluded = [3, 7, 19]
    targets = torch.tensor([0, 1, 2, 4, 5, 6, 8, 9, 10, 3, 7, 19])  # the last three excluded (prompt image tokens)
    log_probs, entropy = restricted_log_probs(hidden, weight, targets, excluded, chunk_size=5, with_entropy=True)
    logits = (hidden @ weight.T).index_fill(1, torch.tensor(excluded), float("-inf"))
    expected = torch.log_softmax(logits, -1)
    torch.testing.assert_close(log_probs[:9], expected.gather(1, targets[:9, None])[:, 0], rtol=0, atol=1e-12)
    p = expected.exp()
    torch.testing.assert_close(entropy, -(p * expected.nan_to_num(neginf=0.0)).sum(-1), rtol=0, atol=1e-12)
    (log_probs.sum() + entropy.sum()).backward()
    assert torch.isfinite(log_probs).all() and torch.isfinite(hidden.grad).all() and torch.isfinite(weight.grad).all()


def test_over_ray_the_images_travel_to_the_workers(data):
    """One step with Ray workers (the actor's process hosting the engine and the reference): the prompts'
    images and the batch's image_inputs cross to them, and the engine's log-probs are still the trainer's."""
    run = [a for a in RUN if not a.startswith(("workers.backend", "rollout.in_actor", "pipeline=", "steps="))]
    argv = [sys.executable, "-m", "roll_lite.cli", "--config", str(REPO / "configs/grpo.yaml"), *run, "steps=1"]
    argv += ["workers.backend=ray", f"data.train_files={data / 'train.jsonl'}", f"output_dir={data / 'out'}"]
    result = warm_driver.run([*argv, "run_name=ray"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (record,) = metrics(data, "ray")
    assert record["actor/grad_norm"] > 0 and record["actor/rollout_logp_gap_max"] < 1e-5, record


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rollout.engine=vllm", "rollout.top_p=0.9"], "rollout.top_p: rollout.engine=vllm with a vision-language"),
        (
            ["pipeline=roll_lite.pipelines.multi_turn:MultiTurnPipeline", "environment.name=guess_the_number"],
            "data.image_key: a multi-turn run's rows seed its environments (environment.name=guess_the_number)",
        ),
        (
            ["pipeline=roll_lite.pipelines.reward_model:RewardModelPipeline"],
            "pipeline: the reward-model pipeline does not train a vision-language model",
        ),
        (["critic.lora.rank=4", "model.freeze_vision=false"], "model.freeze_vision: critic.lora.rank > 0 on a vision"),
        (["actor.lora.rank=4", "model.freeze_vision=false"], "model.freeze_vision: actor.lora.rank > 0 on a vision"),
        (
            ["algorithm.advantage=gae", "critic.sequence_parallel=2", "workers.critic_dp=2"],
            "critic.sequence_parallel: a critic on a vision-language model",
        ),
        (["distill.teacher=teacher"], "distill.teacher: 'teacher' is no vision-language folder"),
        (["model.model_type=qwen2"], "model.freeze_vision: needs a vision-language model: model.model_type=qwen2_5_vl"),
        (
            ["model.model_type=qwen3_vl", "model.hidden_size=8", "model.intermediate_size=16"],
            "model.num_attention_heads: Qwen3-VL's interleaved M-RoPE needs a head_dim",
        ),
    ],
)
def test_what_a_vision_language_model_does_not_run_with_yet_is_a_config_error_naming_the_key(overrides, message):
    from roll_lite.config import ConfigError, load_config

    vision = [*MODEL, "sft.steps=0", "data.image_key=images", "model.freeze_vision=true"]  # good alone: RUN's runs
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(str(REPO / "configs/grpo.yaml"), [*vision, *overrides])


def test_a_pretrained_vision_language_folder_without_its_processor_is_refused_before_anything_starts(tmp_path, capsys):
    """A folder is read (tests/test_vision_folder.py) with the processor saved beside the model, not without."""
    from roll_lite.cli import main

    tiny_vision_config(run_processor()).save_pretrained(tmp_path / "vlm")
    (tmp_path / "vlm" / "model.safetensors").write_bytes(b"")  # never read: the config refuses it first
    assert main([f"model.pretrained_path={tmp_path / 'vlm'}", f"output_dir={tmp_path / 'out'}"]) == 2
    assert f"model.pretrained_path: '{tmp_path / 'vlm'}' has no processor" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
