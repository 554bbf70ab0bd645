"""Image keys (docs/vision.md): data.image_key, the resize bounds data.min_pixels / data.max_pixels,
model.freeze_vision, and what a vision-language model (model.model_type=qwen2_5_vl or
qwen3_vl) does not run with yet.
The images themselves are read and checked with the data, before Ray starts (roll_lite/data/images.py); a
text model then stops there with a config error (roll_lite/data/image_prompts.py)."""

from __future__ import annotations

from roll_lite.config.key_checks import check
from roll_lite.config.schema import RunConfig
from roll_lite.model.vision_folder import folder_vision_type
from roll_lite.model.vision_run import VISION_MODEL_TYPES, is_vision_model

# pipelines that do not train a vision-language model yet (SFT and DPO do: docs/vision.md, "SFT and DPO on image rows")
NOT_ON_IMAGES = {
    "roll_lite.pipelines.reward_model:RewardModelPipeline": "the reward-model pipeline",
}


def validate_vision(config: RunConfig) -> None:
    data = config.data
    if data.image_key is not None:
        check(bool(data.image_key), "data.image_key", "must name a column (null: no images)")
        check(data.source is None, "data.image_key", f"rows from data.source ({data.source}) hold no images")
    for key in ("min_pixels", "max_pixels"):
        value = getattr(data, key)
        if value is None:
            continue
        check(
            data.image_key is not None or config.environment.name is not None,
            f"data.{key}",
            "bounds the images of data.image_key, which is not set (nor environment.name, whose observations' "
            "images it bounds too)",
        )
        check(value >= 1, f"data.{key}", f"must be >= 1 (pixels), got {value}")
    if data.min_pixels is not None and data.max_pixels is not None:
        check(
            data.min_pixels <= data.max_pixels,
            "data.min_pixels",
            f"{data.min_pixels} is over data.max_pixels={data.max_pixels}",
        )
    vision = is_vision_model(config.model)
    check(
        vision or not config.model.freeze_vision,
        "model.freeze_vision",
        f"needs a vision-language model: model.model_type={'|'.join(VISION_MODEL_TYPES)} built from the model keys, or "
        "a Qwen2.5-VL / Qwen3-VL folder as model.pretrained_path "
        f"(model.model_type={config.model.model_type}{', model.pretrained_path is set' * bool(config.model.pretrained_path)})",
    )
    if vision:
        _validate_vision_run(config)


def _validate_vision_run(config: RunConfig) -> None:
    """What a vision-language policy does not run with yet (docs/vision.md, 'Not built yet'): each a config
    error naming its key."""
    vlm = f"a vision-language model, model.model_type={config.model.model_type}"
    r = config.rollout
    check(  # vLLM masks the vision tokens (allowed_token_ids) before its processed log-probs only (docs/vision.md)
        r.engine != "vllm" or (r.top_p == 1.0 and r.top_k == 0),
        "rollout.top_p" if r.top_p != 1.0 else "rollout.top_k",
        f"rollout.engine=vllm with {vlm} records log-probs over the vocabulary without the vision tokens only "
        f"when nothing is truncated: set rollout.top_p=1 and rollout.top_k=0 (or rollout.engine=hf)",
    )
    # the exact decoding loop, single-turn partial rollouts and multi-turn episodes ahead (rollout.fully_async with
    # environment.name) take images (docs/vision.md, "Exact and partial rollouts with images", "Images in
    # multi-turn conversations")
    check(
        config.pipeline not in NOT_ON_IMAGES,
        "pipeline",
        f"{NOT_ON_IMAGES.get(config.pipeline)} does not train {vlm} yet: the PPO / GRPO, multi-turn, SFT and "
        "DPO pipelines do",
    )
    # multi-turn (MultiTurnPipeline): the images come from the environment's observations (docs/vision.md)
    check(
        config.environment.name is None or config.data.image_key is None,
        "data.image_key",
        f"a multi-turn run's rows seed its environments (environment.name={config.environment.name}) and hold no "
        f"images; {vlm} sees the images the environment's observations show: set null",
    )
    if config.critic.lora.rank:  # adapters on the critic's language model only, as on the actor's
        check(
            config.model.freeze_vision,
            "model.freeze_vision",
            f"critic.lora.rank > 0 on {vlm} puts adapters on its language model only and keeps its vision tower "
            "frozen with the rest of the base: set true (a tower trained beside the adapters is not built)",
        )
    if config.actor.lora.rank:  # adapters on the language model only (roll_lite/lora/vision.py)
        check(
            config.model.freeze_vision,
            "model.freeze_vision",
            f"actor.lora.rank > 0 on {vlm} puts adapters on its language model only and keeps the vision tower "
            "frozen with the rest of the base: set true (training the tower in full beside the adapters is not built)",
        )
    if config.algorithm.advantage == "gae":  # the critic's value head reads the images too (vision_heads.py)
        check(
            config.critic.sequence_parallel == 1,
            "critic.sequence_parallel",
            f"a critic on {vlm} has no sequence parallelism yet: set 1",
        )
    # a teacher reads the images too: a vision-language folder (its ids and pixels checked before Ray:
    # pipelines/teachers.py, roll_lite/model/vision_teacher_folder.py)
    d = config.distill
    for key, folder in ([("distill.teacher", d.teacher)] if d.teacher else []) + [
        (f"distill.teachers.{domain}", folder) for domain, folder in (d.teachers or {}).items()
    ]:
        check(
            folder_vision_type(folder) is not None,
            key,
            f"'{folder}' is no vision-language folder (config.json with a vision_config): a text teacher cannot see "
            f"the images of the prompts of {vlm}; name a teacher folder of the student's family",
        )
    check(  # the head's top-k on image prompts is built for a whole sequence (roll_lite/model/vision_teacher.py)
        not (d.teacher or d.teachers) or d.signal != "top_k_forward_kl" or config.actor.sequence_parallel == 1,
        "distill.signal",
        f"top_k_forward_kl with {vlm} under actor.sequence_parallel={config.actor.sequence_parallel} is not built: "
        "use advantage or reverse_kl, or actor.sequence_parallel=1",
    )
    m = config.model
    if (
        m.model_type == "qwen3_vl" and m.pretrained_path is None
    ):  # interleaved M-RoPE (roll_lite/model/qwen3_vl.py, interleaved_mrope_section)
        head_dim = m.hidden_size // max(m.num_attention_heads, 1)
        check(
            head_dim >= 6,
            "model.num_attention_heads",
            f"Qwen3-VL's interleaved M-RoPE needs a head_dim (model.hidden_size / model.num_attention_heads) of "
            f"at least 6, got {m.hidden_size} / {m.num_attention_heads} = {head_dim}",
        )
