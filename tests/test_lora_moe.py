"""LoRA on an MoE policy (docs/lora.md, docs/moe.md): adapters on the attention and on the experts' fused
[experts, out, in] weights (peft's target_parameters), the base frozen.

- The merge (roll_lite/lora/adapters.py merged_state) of a tiny float64 Qwen3-MoE with non-zero adapters gives the
  adapted model's logits bit for bit, the PEFT folder loads with PeftModel.from_pretrained to the same logits, and
  adapters off give the base's.
- roll-train GRPO on a tiny Qwen3-MoE with those adapters, a KL to the reference (the adapters off), router replay
  and the engine in a process of its own fed the adapters alone after the first sync (workers.backend=local): every
  step's engine log-probs match the actor's (rollout.max_logp_gap), and the final folder's merged model is peft's.
- What cannot be adapted is a config error naming the key. (The gradients' exactness: tests/test_exactness_moe.py.)
"""

import copy
import json
import tempfile
from pathlib import Path

import pytest
import torch
from moe_cases import LORA, MOE_MODEL, moe_lm
from test_lora_run import assert_merged_is_the_peft_policy
from test_moe_run import MOE, command
from test_resume import data, metrics, run  # noqa: F401 (data: a fixture)

from roll_lite.config import ConfigError, load_config
from roll_lite.lora.adapters import (
    adapted_modules,
    adapted_parameters,
    adapter_state,
    adapters_disabled,
    merged_for,
    write_peft_adapter,
)

LORA_RUN = [
    "steps=3",
    "rollout.async_steps=0",
    "actor.lora.rank=4",
    "actor.lora.alpha=8",
    "actor.lora.target_parameters=experts",
    "rollout.in_actor=false",
    "rollout.max_logp_gap=1e-4",
    "algorithm.kl_coef=0.05",
    "actor.router_replay=rollout",
    "actor.use_packing=true",
    "save_model=true",
    "actor.lora.save_merged=true",
]


def test_merged_and_peft_folder_give_the_adapted_models_logits():
    lm, base = moe_lm(lora=True), moe_lm()
    assert adapted_parameters(lm) == ["experts.down_proj", "experts.gate_up_proj"]
    assert all(".lora_" in name for name, p in lm.named_parameters() if p.requires_grad)
    ids = torch.randint(0, MOE_MODEL["vocab_size"], (3, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), tempfile.TemporaryDirectory() as folder:
        adapted = lm(ids).logits
        assert (adapted - base(ids).logits).abs().max() > 1e-2  # the expert adapters change the policy
        plain = copy.deepcopy(base)
        plain.load_state_dict(merged_for(lm.state_dict(), LORA, lm))
        assert torch.equal(plain(ids).logits, adapted)
        with adapters_disabled(lm):
            assert torch.equal(lm(ids).logits, base(ids).logits)
        adapters = adapter_state(lm.state_dict())
        write_peft_adapter(Path(folder), adapters, LORA, adapted_modules(lm), None, adapted_parameters(lm))
        from peft import PeftModel

        assert torch.equal(PeftModel.from_pretrained(copy.deepcopy(base), folder)(input_ids=ids).logits, adapted)


@pytest.fixture(scope="module")
def lora_run(data, tmp_path_factory):  # noqa: F811 (data: test_resume's fixture)
    output = tmp_path_factory.mktemp("lora_moe")
    log = run(command(data, output, "lora", *LORA_RUN)).stderr
    return output / "lora", log


def test_the_engine_samples_with_the_actors_expert_adapters(lora_run):
    run_dir, log = lora_run
    records = [r for r in metrics(run_dir) if r["step"] >= 1]
    assert len(records) == 3
    assert "experts.down_proj" in log and "experts.gate_up_proj" in log  # the worker's LoRA line
    # max_logp_gap=1e-4 held at every step or the run would have stopped; float32 noise
    assert all(r["actor/rollout_logp_gap"] < 1e-5 for r in records), [r["actor/rollout_logp_gap"] for r in records]
    assert records[0]["actor/kl"] == 0 and records[-1]["actor/kl"] > 0  # the reference: the adapters off
    assert all(r["moe/routing_drift"] == 0 for r in records)


def test_the_final_folder_loads_with_peft_and_its_merged_model_is_the_same_policy(lora_run):
    final = lora_run[0] / "final"
    config = json.loads((final / "adapter_config.json").read_text())
    assert config["target_parameters"] == ["experts.down_proj", "experts.gate_up_proj"]
    assert_merged_is_the_peft_policy(final, moved_by=1e-4)
    moved = {name for name, tensor in _adapters(final).items() if ".lora_B." in name and tensor.abs().max() > 0}
    assert any(".experts." in name for name in moved)  # the expert adapters trained


def _adapters(final: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(final / "adapter_model.safetensors")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.model_type=qwen2"], "actor.lora.target_parameters: Qwen2ForCausalLM has no MoE experts"),
        (["actor.lora.target_parameters=[up_proj]"], "actor.lora.target_parameters: ['up_proj'] name no expert"),
        (["actor.lora.dropout=0.1"], "actor.lora.dropout: peft's expert-weight adapters"),
        (
            ["rollout.engine=vllm", "workers.gpus_per_rank=1"],
            "actor.lora.target_parameters: expert-weight adapters are served by",
        ),
    ],
)
def test_what_cannot_be_adapted_is_a_config_error_naming_the_key(overrides, message):
    from pipelines.preflight import check_run

    moe = [o for o in MOE if o.startswith("model.")]
    lora = ["actor.lora.rank=4", "actor.lora.target_parameters=experts"]
    with pytest.raises(ConfigError) as error:
        check_run(load_config(None, [*moe, *lora, *overrides]))
    assert str(error.value).startswith(message), str(error.value)
