"""Image keys (docs/vision.md): data.image_key, the resize bounds data.min_pixels / data.max_pixels,
model.freeze_vision, and what a vision-language model (model.model_type=qwen2_5_vl) does not run with yet.
The images themselves are read and checked with the data, before Ray starts (roll_lite/data/images.py); a
text model then stops there with a config error (roll_lite/data/image_prompts.py)."""

from __future__ import annotations

from roll_lite.config.key_checks import check
from roll_lite.config.schema import RunConfig
from roll_lite.model.vision_run import VISION_MODEL_TYPES, is_vision_model

# pipelines that train a vision-language model on nothing but the RL prompts yet
NOT_ON_IMAGES = {
    "roll_lite.pipelines.sft:SFTPipeline": "SFT",
    "roll_lite.pipelines.dpo:DPOPipeline": "DPO",
    "roll_lite.pipelines.reward_model:RewardModelPipeline": "the reward-model pipeline",
    "roll_lite.pipelines.multi_turn:MultiTurnPipeline": "the multi-turn pipeline",
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
        check(data.image_key is not None, f"data.{key}", "bounds the images of data.image_key, which is not set")
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
        f"needs a vision-language model: model.model_type={'|'.join(VISION_MODEL_TYPES)} built from the model keys "
        f"(model.model_type={config.model.model_type}{', model.pretrained_path is set' * bool(config.model.pretrained_path)})",
    )
    if vision:
        _validate_vision_run(config)


def _validate_vision_run(config: RunConfig) -> None:
    """What a vision-language policy does not run with yet (docs/vision.md, 'Not built yet'): each a config
    error naming its key."""
    vlm = f"a vision-language model, model.model_type={config.model.model_type}"
    r = config.rollout
    check(r.engine == "hf", "rollout.engine", f"{r.engine} does not generate from images yet; {vlm} needs hf")
    check(not r.exact, "rollout.exact", f"the exact decoding loop takes no images yet ({vlm}): set false")
    check(not r.fully_async, "rollout.fully_async", f"partial rollouts take no images yet ({vlm}): set false")
    check(
        config.environment.name is None and config.pipeline not in NOT_ON_IMAGES,
        "pipeline" if config.environment.name is None else "environment.name",
        f"{NOT_ON_IMAGES.get(config.pipeline, 'multi-turn rollouts')} does not train {vlm} yet: PPO / GRPO "
        "(roll_lite.pipelines.ppo:PPOPipeline) do",
    )
    check(config.sft.steps == 0, "sft.steps", f"the SFT warm start does not train {vlm} yet: set 0")
    check(
        config.actor.sequence_parallel == 1,
        "actor.sequence_parallel",
        f"batches with images are not split over ranks yet ({vlm}): set 1",
    )
    for role in ("actor", "critic"):
        check(getattr(config, role).lora.rank == 0, f"{role}.lora.rank", f"no LoRA on {vlm} yet: set 0")
    check(
        config.algorithm.advantage != "gae",
        "algorithm.advantage",
        f"gae needs a critic, and no value head is built on {vlm} yet: use grpo, dr_grpo, rloo or reinforce_pp",
    )
    check(
        not (config.distill.teacher or config.distill.teachers),
        "distill.teacher",
        f"teachers do not score image prompts yet ({vlm})",
    )
