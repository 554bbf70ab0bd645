"""A pretrained vision-language model's folder as model.pretrained_path (docs/vision.md, "A pretrained folder";
roll_lite/model/vision_folder.py): a tiny Qwen2.5-VL and a tiny Qwen3-VL built here, each saved with its processor
by save_pretrained. GRPO runs two steps from the Qwen2.5-VL folder (workers.backend=local): the actor starts from
the folder's weights, the prompts are the folder's processor's, the engine's log-probs are the trainer's, and the
final folder it saves loads back (model and processor) to the same log-probs. A folder whose processor disagrees
with its config.json, or of a family roll_lite does not read, is a config error before anything starts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image
from roll_lite.pipelines.ppo import PPOPipeline
from roll_lite.pipelines.sft import SFTPipeline
from tiny_vlm import TINY_VLM_SIZES

from roll_lite.model.vision import VisionLMWithLogProbs, build_vision_model, encode_conversation
from roll_lite.model.vision_folder import load_folder_processor
from roll_lite.model.vision_run import run_processor, vision_config, vision_token_ids

REPO = Path(__file__).resolve().parents[1]
SIZES = [*TINY_VLM_SIZES]
FAMILIES = ("qwen2_5_vl", "qwen3_vl")
PROMPT = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "color?"}]}]
RECORDED: dict[str, dict] = {}  # run name -> its first batch, its actor's weights before training and when saved
BUILT: dict[str, dict] = {}  # family -> the state dict saved in its folder


class Recording(PPOPipeline):
    def collect_rollout(self, step):
        batch, behind = super().collect_rollout(step)
        RECORDED.setdefault(self.config.run_name, {}).setdefault("batch", batch)
        return batch, behind

    def step(self, step):
        record = RECORDED.setdefault(self.config.run_name, {})
        if "start" not in record:
            record["start"] = {k: v.clone() for k, v in self.actor.state_dict().items()}
        return super().step(step)

    def save_final(self, path):
        RECORDED[self.config.run_name]["saved"] = {k: v.clone() for k, v in self.actor.state_dict().items()}
        super().save_final(path)


class SavingSFT(SFTPipeline):
    def save_final(self, path):
        RECORDED.setdefault(self.config.run_name, {})["saved"] = dict(self.actor.state_dict())
        super().save_final(path)


def save_folder(root: Path, family: str) -> Path:
    """A tiny model of `family` (the model keys' build, seed 3) and its processor, saved as a hub folder is."""
    from roll_lite.config import load_config

    model_config = load_config(None, [*SIZES, f"model.model_type={family}"]).model
    folder = root / family
    model = build_vision_model(vision_config(model_config), seed=3)
    model.save_pretrained(folder)
    BUILT[family] = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    run_processor(SimpleNamespace(min_pixels=64, max_pixels=512), family).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from roll_lite.cli import main

    root = tmp_path_factory.mktemp("vision_folder")
    folders = {family: save_folder(root, family) for family in FAMILIES}
    for name, size in (("red", (16, 16)), ("blue", (24, 8))):
        Image.new("RGB", size, {"red": (255, 0, 0), "blue": (0, 0, 255)}[name]).save(root / f"{name}.png")
    rows = [{"prompt": PROMPT, "images": [f"{name}.png"], "answer": name} for name in ("red", "blue")]
    (root / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    overrides = [
        "sft.steps=0",
        "workers.backend=local",
        "workers.torch_threads=1",
        "rollout.in_actor=false",
        "rollout.prompts_per_step=2",
        "rollout.num_samples=2",
        "rollout.max_new_tokens=4",
        "reward.functions={token_accuracy: 1.0}",
        "algorithm.entropy_coef=0.01",
        "actor.lr=1e-2",
        "data.image_key=images",
        "data.max_prompt_length=100",
        f"data.train_files={root / 'train.jsonl'}",
        "data.eval_files=[]",
        "eval_every=100",
        "checkpoint.enabled=false",
        f"output_dir={root / 'out'}",
        "pipeline=test_vision_folder:Recording",
    ]
    final = root / "out" / "qwen2_5_vl" / "final"
    # run name -> (its folder, steps): each family's folder, then the first run's final folder continued
    runs = {family: (folders[family], 2 if family == "qwen2_5_vl" else 1) for family in FAMILIES}
    runs["continued"] = (final, 1)
    for name, (folder, steps) in runs.items():
        settings = [f"model.pretrained_path={folder}", f"steps={steps}", f"save_model={name == 'qwen2_5_vl'}"]
        assert main(["--config", str(REPO / "configs/grpo.yaml"), *overrides, *settings, f"run_name={name}"]) == 0
    sft = [*SIZES, "model.model_type=qwen2_5_vl", "model.pretrained_path=null", "sft.response_key=answer"]
    sft += ["sft.steps=1", "sft.batch_size=2", "sft.eval_files=null", f"sft.train_files={root / 'train.jsonl'}"]
    sft += [*overrides[1:3], "data.image_key=images", "save_model=true", *overrides[-3:-1], "run_name=sft_built"]
    assert main(["--config", str(REPO / "configs/sft.yaml"), *sft, "pipeline=test_vision_folder:SavingSFT"]) == 0
    return SimpleNamespace(root=root, folders={**folders, "continued": final}, final=final, runs=runs)


def policy_log_probs(model, processor, image) -> torch.Tensor:
    encoded = encode_conversation(processor, PROMPT, [image])
    ids = encoded["input_ids"][None]
    with torch.no_grad():
        return VisionLMWithLogProbs(model)(
            ids,
            torch.arange(ids.shape[1])[None],
            pixel_values=encoded["pixel_values"],
            image_grid_thw=encoded["image_grid_thw"],
        )["log_probs"]


@pytest.mark.parametrize("name", [*FAMILIES, "continued"])
def test_each_run_starts_from_its_folder_and_trains_on_its_processors_ids(run, name):
    """The continued run starts from the weights the first run saved (roll-train ... model.pretrained_path=final)."""
    start = RECORDED[name]["start"]
    expected_start = RECORDED["qwen2_5_vl"]["saved"] if name == "continued" else BUILT[name]
    assert set(start) == set(expected_start)
    assert all(torch.equal(start[key], tensor) for key, tensor in expected_start.items())
    records = [json.loads(line) for line in (run.root / "out" / name / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in records if r["step"] >= 1]
    assert [r["step"] for r in trained] == list(range(1, run.runs[name][1] + 1))
    for r in trained:
        assert r["actor/rollout_logp_gap"] < 1e-5 and r["actor/rollout_logp_gap_max"] < 1e-5, r
    fresh, _ = load_folder_processor(str(run.folders[name]))
    batch = RECORDED[name]["batch"]
    for row in range(len(batch)):
        image = Image.open(run.root / f"{batch.non_tensor_batch['answer'][row]}.png").convert("RGB")
        expected = encode_conversation(fresh, PROMPT, [image])
        start_of_response = int(batch["response_mask"][row].argmax())
        assert torch.equal(batch["input_ids"][row, :start_of_response], expected["input_ids"])
        inputs = batch.non_tensor_batch["image_inputs"][row]
        assert torch.equal(inputs["pixel_values"], expected["pixel_values"])
        assert torch.equal(inputs["image_grid_thw"], expected["image_grid_thw"])


def test_the_saved_final_folder_loads_back_to_the_same_log_probs(run):
    """Round trip: the final folder (model + processor) as model.pretrained_path gives the saved weights' log-probs
    on an image prompt, bit for bit in float32; the processor it holds renders the prompt as the run's did."""
    from roll_lite.config import load_config
    from roll_lite.model.vision_run import load_vision_lm, model_processor, run_tokenizer

    config = load_config(None, [f"model.pretrained_path={run.final}", "sft.steps=0"])
    loaded = load_vision_lm(config.model, seed=0)
    assert loaded.excluded_token_ids == vision_token_ids(run_tokenizer(config.model))  # the folder's tokens' ids
    original = load_vision_lm(load_config(None, [f"model.pretrained_path={run.folders['qwen2_5_vl']}"]).model, seed=0)
    saved = RECORDED["qwen2_5_vl"]["saved"]
    assert not torch.equal(original.state_dict()["lm_head.weight"], saved["lm_head.weight"])  # it trained
    original.load_state_dict(saved)
    original.excluded_token_ids = loaded.excluded_token_ids
    processor = model_processor(config.model)
    image = Image.open(run.root / "blue.png").convert("RGB")
    run_ids = encode_conversation(load_folder_processor(str(run.folders["qwen2_5_vl"]))[0], PROMPT, [image])
    assert torch.equal(encode_conversation(processor, PROMPT, [image])["input_ids"], run_ids["input_ids"])
    assert torch.equal(policy_log_probs(loaded, processor, image), policy_log_probs(original, processor, image))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_folder_loads_its_model_and_processor_and_data_bounds_override_the_folders(run, family):
    from roll_lite.config import load_config
    from roll_lite.model.vision_run import load_vision_lm, model_processor

    folder = run.folders[family]
    model_config = load_config(None, [f"model.pretrained_path={folder}"]).model
    processor = model_processor(model_config)
    local = run_processor(SimpleNamespace(min_pixels=64, max_pixels=512), family)
    assert processor.image_token_id == local.image_token_id and type(processor) is type(local)
    image = Image.new("RGB", (40, 40), (0, 90, 200))  # 1600 pixels: resized down to the folder's 512
    mine, theirs = encode_conversation(processor, PROMPT, [image]), encode_conversation(local, PROMPT, [image])
    assert all(torch.equal(mine[key], theirs[key]) for key in theirs)
    wider = model_processor(model_config, SimpleNamespace(min_pixels=None, max_pixels=2048))
    assert wider.image_processor.size.longest_edge == 2048 and wider.image_processor.size.shortest_edge == 64
    built = build_vision_model(vision_config(load_config(None, [*SIZES, f"model.model_type={family}"]).model), seed=3)
    loaded = load_vision_lm(model_config, seed=0)
    built.excluded_token_ids = loaded.excluded_token_ids  # the vision tokens, as the run's restricted vocabulary
    assert torch.equal(policy_log_probs(loaded, processor, image), policy_log_probs(built, local, image))


def _rewrite(folder: Path, name: str, change) -> None:
    settings = json.loads((folder / name).read_text())
    change(settings)
    (folder / name).write_text(json.dumps(settings))


def _copy(run, tmp_path: Path, family: str = "qwen2_5_vl") -> Path:
    import shutil

    return Path(shutil.copytree(run.folders[family], tmp_path / family))


BAD = {
    "merge size": (
        "processor_config.json",
        lambda s: s["image_processor"].update(merge_size=1),
        "model.pretrained_path: processor_config.json's merge_size is 1 but config.json's "
        "vision_config.spatial_merge_size is 2",
    ),
    "image token": (
        "config.json",
        lambda s: s.update(image_token_id=5),
        "model.pretrained_path: tokenizer.json gives <|image_pad|> the id",
    ),
    "family": (
        "config.json",
        lambda s: s.update(model_type="qwen2_vl"),
        "model.pretrained_path: '{folder}' holds a qwen2_vl vision-language model",
    ),
    "no processor": (
        "processor_config.json",
        lambda s: s.pop("image_processor"),
        "model.pretrained_path: '{folder}' has no processor",
    ),
}


@pytest.mark.parametrize("bad", BAD)
def test_a_folder_whose_processor_disagrees_or_of_another_family_is_a_config_error(run, tmp_path, bad):
    """Negative controls: each folder is the run's good one with one file changed."""
    from roll_lite.pipelines.preflight import check_run

    from roll_lite.config import ConfigError, load_config

    name, change, message = BAD[bad]
    folder = _copy(run, tmp_path)
    _rewrite(folder, name, change)
    config = load_config(None, [f"model.pretrained_path={folder}", "sft.steps=0"])
    with pytest.raises(ConfigError, match=re.escape(message.format(folder=folder))):
        check_run(config)
    check_run(load_config(None, [f"model.pretrained_path={run.folders['qwen2_5_vl']}", "sft.steps=0"]))


def test_an_sft_run_of_a_model_built_from_the_keys_saves_a_folder_that_loads_back(run):
    """configs/sft.yaml on image rows, the model built from the model keys: its final/ is a pretrained folder
    (model + the run's processor) whose log-probs on an image prompt are the saved weights' (float32, bit for bit)."""
    from roll_lite.pipelines.preflight import check_run

    from roll_lite.config import load_config
    from roll_lite.model.vision_run import load_vision_lm, model_processor

    final = run.root / "out" / "sft_built" / "final"
    config = load_config(None, [f"model.pretrained_path={final}", "sft.steps=0"])
    check_run(config)
    processor, image = model_processor(config.model), Image.open(run.root / "red.png").convert("RGB")
    local = run_processor(None, "qwen2_5_vl")  # the SFT run's: data.min_pixels / max_pixels null
    mine, theirs = encode_conversation(processor, PROMPT, [image]), encode_conversation(local, PROMPT, [image])
    assert all(torch.equal(mine[key], theirs[key]) for key in theirs)
    loaded = load_vision_lm(config.model, seed=0)
    built = build_vision_model(vision_config(load_config(None, [*SIZES, "model.model_type=qwen2_5_vl"]).model), seed=7)
    built.load_state_dict(RECORDED["sft_built"]["saved"])
    built.excluded_token_ids = loaded.excluded_token_ids
    assert torch.equal(policy_log_probs(loaded, processor, image), policy_log_probs(built, processor, image))


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.tokenizer_path={other}", "model.tokenizer_path: a vision-language model's tokenizer is its folder's"),
        ("model.chat_template=compact", "model.chat_template: a vision-language model's chat template is its folder's"),
    ],
)
def test_a_tokenizer_or_chat_template_beside_a_folder_is_a_config_error(run, override, message):
    from roll_lite.pipelines.preflight import check_run

    from roll_lite.config import ConfigError, load_config

    folder = run.folders["qwen2_5_vl"]
    config = load_config(None, [f"model.pretrained_path={folder}", "sft.steps=0", override.format(other=run.final)])
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_run(config)
