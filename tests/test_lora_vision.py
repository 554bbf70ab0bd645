"""LoRA on a vision-language policy (docs/vision.md, "LoRA on a vision-language model"): the adapters go on the
language model alone, never on the vision tower's Linear layers, whose short names partly coincide with the
decoder's (Qwen2.5-VL's vision MLP is gate_proj / up_proj / down_proj); and a GRPO run through roll-train
(workers.backend=local, the engine a worker of its own) on test_vision_run.py's image rows: the engine gets the base
once and the adapters each sync after, its log-probs stay the trainer's, the tower stays as built, and the final
folder loads with peft onto its base as its merged model. The exactness rows are in test_exactness_vision.py."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image
from test_vision_run import MODEL, RECORDS, REPO, RUN, data, initial_vision, metrics  # noqa: F401 (data: a fixture)
from vision_cases import processor

from roll_lite.config import ConfigError
from roll_lite.lora.adapters import add_adapters, target_modules
from roll_lite.lora.settings import LoraSettings
from roll_lite.model.qwen3_vl import tiny_qwen3_vl_config
from roll_lite.model.vision import build_vision_model, tiny_vision_config

LM_LINEAR = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
LM_TARGETS = r"model\.language_model\..*\.(" + "|".join(LM_LINEAR) + ")"


def adapted(model: torch.nn.Module) -> list[str]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [name for name, module in model.named_modules() if isinstance(module, BaseTunerLayer)]


@pytest.mark.parametrize("model_type", ["qwen2_5_vl", "qwen3_vl"])
def test_adapters_go_on_the_language_model_and_never_on_the_vision_tower(model_type):
    tiny = tiny_qwen3_vl_config if model_type == "qwen3_vl" else tiny_vision_config
    build = lambda: build_vision_model(tiny(processor(model_type)), seed=0)  # noqa: E731
    for wanted, short in (("all-linear", LM_LINEAR), (["gate_proj", "up_proj", "down_proj"], None)):
        lm = add_adapters(build(), LoraSettings(rank=2, target_modules=wanted), seed=0)
        names = adapted(lm)  # each wanted short name in each of the 2 decoder layers, nothing else
        assert all(n.startswith("model.language_model.layers.") for n in names), names
        assert sorted(n.rsplit(".", 1)[-1] for n in names) == sorted(2 * (short or wanted)), names
        assert [n for n, p in lm.named_parameters() if p.requires_grad] == [
            n for n, _ in lm.named_parameters() if ".lora_" in n
        ]
    # the vision tower's own names are no target: a config error naming the key and the language model's modules
    with pytest.raises(
        ConfigError, match=r"actor.lora.target_modules: \['qkv'\] match no Linear module of .*'s language"
    ):
        target_modules(LoraSettings(rank=2, target_modules=["qkv", "q_proj"]), build())
    if model_type == "qwen2_5_vl":  # the control: short names alone (peft's own matching) adapt the tower too
        from peft import LoraConfig, inject_adapter_in_model

        naive = inject_adapter_in_model(LoraConfig(r=2, target_modules=["gate_proj"]), build())
        assert "model.visual.blocks.0.mlp.gate_proj" in adapted(naive)


LORA = ["model.freeze_vision=true", "actor.lora.rank=4", "actor.lora.alpha=8", "actor.lora.save_merged=true"]
LORA += ["rollout.max_logp_gap=1e-4", "save_model=true", "run_name=lora"]


@pytest.fixture(scope="module")
def lora_run(data):
    """The run, with what each weight sync brought the engine (workers/rollout_worker.py update_weights)."""
    from roll_lite.workers.rollout_worker import RolloutWorker  # the run imports it as roll_lite.workers

    from roll_lite.cli import main
    from roll_lite.lora.adapters import is_adapter
    from roll_lite.model.weights import unflatten_state_dict

    syncs: list[str] = []
    update_weights = RolloutWorker.update_weights

    def recorded(self, weights, version):
        names = set(unflatten_state_dict(weights))
        tower = any(name.startswith("model.visual.") for name in names)  # the whole base, the tower included
        syncs.append("adapters" if all(map(is_adapter, names)) else "base" if tower else "?")
        return update_weights(self, weights, version)

    common = [*RUN, f"data.train_files={data / 'train.jsonl'}", f"output_dir={data / 'out'}"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RolloutWorker, "update_weights", recorded)
        assert main(["--config", str(REPO / "configs/grpo.yaml"), *common, *LORA]) == 0
    return data, syncs


def test_the_engine_gets_the_base_once_then_the_adapters_and_samples_with_them(lora_run):
    folder, syncs = lora_run
    assert syncs == ["base", "adapters", "adapters"], syncs  # before step 1, after steps 1 and 2
    records = metrics(folder, "lora")
    assert [r["step"] for r in records] == [1, 2]
    for r in records:  # max_logp_gap=1e-4 held, or the run would have stopped; float32 noise on image prompts
        assert r["actor/grad_norm"] > 0 and r["actor/rollout_logp_gap_max"] < 1e-5, r
    start = initial_vision()
    for step in RECORDS["lora"]:  # the tower, in the actor and in the engine, is the seeded build's
        assert step["actor"].keys() == step["engine"].keys() == start.keys()
        assert all(torch.equal(step["actor"][n], v) and torch.equal(step["engine"][n], v) for n, v in start.items())


def test_the_final_folder_loads_with_peft_onto_its_base_as_its_merged_model(lora_run):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    from roll_lite.model.vision import encode_conversation
    from roll_lite.model.vision_run import run_processor

    folder, _ = lora_run
    final = folder / "out" / "lora" / "final"
    config = json.loads((final / "adapter_config.json").read_text())
    assert config["target_modules"] == LM_TARGETS and config["r"] == 4
    names = load_file(final / "adapter_model.safetensors").keys()
    assert names and all(n.startswith("base_model.model.model.language_model.layers.") for n in names)
    base = AutoModelForImageTextToText.from_pretrained(final / "base")
    policy = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(final / "base"), str(final))
    merged = AutoModelForImageTextToText.from_pretrained(final / "merged")
    assert adapted(policy) and not [n for n in adapted(policy) if ".visual." in n]
    start = initial_vision()
    for model in (base, merged):  # the tower is the seeded build's, in both folders
        state = model.state_dict()
        assert all(torch.equal(state[n], v) for n, v in start.items())
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "color?"}]}]
    inputs = encode_conversation(run_processor(), messages, [Image.open(folder / "red.png").convert("RGB")])
    inputs = {k: v[None] if k == "input_ids" else v for k, v in inputs.items()}
    with torch.no_grad():
        expected = policy(**inputs).logits
        torch.testing.assert_close(merged(**inputs).logits, expected, rtol=1e-5, atol=1e-5)
        assert (base(**inputs).logits - expected).abs().max() > 1e-4  # RL moved the adapters


def test_a_target_only_the_vision_tower_has_stops_roll_train_before_anything_starts(data, capsys):
    from roll_lite.cli import main

    out = data / "refused"
    argv = ["--config", str(REPO / "configs/grpo.yaml"), *MODEL, "sft.steps=0", "data.image_key=images"]
    argv += [
        f"data.train_files={data / 'train.jsonl'}",
        f"output_dir={out}",
        *LORA[:2],
        "actor.lora.target_modules=[qkv]",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "actor.lora.target_modules: ['qkv'] match no Linear module of Qwen2_5_VLForConditionalGeneration's" in err
    assert not out.exists()
