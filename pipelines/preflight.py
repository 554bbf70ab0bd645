"""Checks that need more than the config's own values (the model's config, the tokenizer, this
machine), made in the driver before Ray starts or any output folder exists.

`check_run(config)` (and, once the data is read, `check_sequence_lengths`) raises ConfigError with
one line naming the key. It reads the model's config (AutoConfig: config.json only, never the
weights) and loads the tokenizer; both are cheap. A model built from the `model` keys gets its
transformers config class only in the workers: that class's docstring decorator imports transformers'
model classes, ~1 s of CPU the driver does not otherwise need.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TypeAlias

from transformers import AutoConfig, PretrainedConfig, PreTrainedTokenizerBase
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from roll_lite.config import ConfigError, RunConfig
from roll_lite.model.files import first_line, locate
from roll_lite.model.vision_run import run_tokenizer


@dataclass(frozen=True)
class BuiltModel:
    """What the checks read of a model built from the `model` keys."""

    vocab_size: int
    max_position_embeddings: int


ModelConfig: TypeAlias = PretrainedConfig | BuiltModel


def check_run(config: RunConfig) -> ModelConfig:
    """The checks, in order; returns the model's config (a BuiltModel for a built one) for
    `check_sequence_lengths`."""
    model_config = _pretrained_config(config.model) if config.model.pretrained_path else None
    if model_config is not None and hasattr(model_config, "vision_config"):
        model_config = _vision_folder(config, model_config)  # what the checks below read: its language model's
    tokenizer = _tokenizer(config)
    if model_config is None:
        model_config = _built_config(config.model, len(tokenizer))
    if config.model.pretrained_path and len(tokenizer) > model_config.vocab_size:
        raise ConfigError(
            f"model.tokenizer_path: the tokenizer has {len(tokenizer)} tokens but the model "
            f"(model.pretrained_path) has vocab_size {model_config.vocab_size}; ids from {model_config.vocab_size} "
            "on have no embedding: use the model's own tokenizer"
        )
    _check_positions(config, model_config, longest_prompt=None)
    _check_sequence_parallel(config, model_config)
    _check_teachers_sequence_parallel(config)
    _check_lora_targets(config, model_config)
    _check_moe(config, model_config)
    _check_rollout_engine(config)
    _check_cpus(config)
    return model_config


def _check_sequence_parallel(config: RunConfig, model_config: ModelConfig) -> None:
    """actor / critic.sequence_parallel against a pretrained model's heads (a built model's: validation.py)."""
    if not isinstance(model_config, PretrainedConfig):
        return
    from roll_lite.strategy.config import sequence_parallel_problem

    heads = getattr(model_config, "num_attention_heads", None)
    kv_heads = getattr(model_config, "num_key_value_heads", None) or heads
    for role in ("actor", "critic"):
        degree, ranks = getattr(config, role).sequence_parallel, getattr(config.workers, f"{role}_dp")
        if problem := sequence_parallel_problem(degree, ranks, heads, kv_heads):
            raise ConfigError(f"{role}.sequence_parallel: {problem} (model.pretrained_path's config.json)")


def _check_teachers_sequence_parallel(config: RunConfig) -> None:
    """The distillation teachers run at actor.sequence_parallel on workers.reference_dp: their heads too."""
    from roll_lite.strategy.config import sequence_parallel_problem

    degree, d = config.actor.sequence_parallel, config.distill
    teachers = (
        {"distill.teacher": d.teacher} if d.teacher else {f"distill.teachers.{k}": v for k, v in d.teachers.items()}
    )
    for key, folder in teachers.items() if degree > 1 else ():
        try:
            teacher = AutoConfig.from_pretrained(folder, trust_remote_code=config.model.trust_remote_code)
        except Exception:  # a folder that is not a model: the teachers' own check names it (pipelines/teachers.py)
            continue
        heads = getattr(teacher, "num_attention_heads", None)
        kv_heads = getattr(teacher, "num_key_value_heads", None) or heads
        if problem := sequence_parallel_problem(degree, config.workers.reference_dp or 1, heads, kv_heads):
            raise ConfigError(f"actor.sequence_parallel: {problem} (the teacher's config.json, {key})")


def _check_moe(config: RunConfig, model_config: ModelConfig) -> None:
    """actor.router_replay, the MoE auxiliary losses and actor.expert_parallel need an MoE policy: a pretrained
    model's config.json names its experts, which EP must divide (a built model's: roll_lite/config/validation_moe.py)."""
    from roll_lite.config.validation_moe import moe_key, vllm_cpu_moe_problem
    from roll_lite.strategy.config import expert_parallel_problem

    if not isinstance(model_config, PretrainedConfig):
        return
    experts = getattr(model_config, "num_experts", None) or getattr(model_config, "num_local_experts", None)
    if problem := vllm_cpu_moe_problem(config, bool(experts)):
        raise ConfigError(f"rollout.engine: {problem} (model.pretrained_path's config.json names experts)")
    degree = config.actor.expert_parallel
    key = moe_key(config) or ("expert_parallel" if degree > 1 else None)
    if key is None:
        return
    if not experts:
        raise ConfigError(
            f"actor.{key}: model.pretrained_path's config.json names no experts (num_experts / num_local_experts): "
            "a dense model has no routing to replay, balance or split"
        )
    if problem := expert_parallel_problem(degree, config.workers.actor_dp, experts):
        problem = problem.replace("the role's", "workers.actor_dp:")
        raise ConfigError(f"actor.expert_parallel: {problem} (model.pretrained_path's config.json)")


def _check_lora_targets(config: RunConfig, model_config: ModelConfig) -> None:
    """actor.lora / critic.lora target_modules against the model's Linear modules (a model on the meta
    device: no memory, no weights)."""
    roles = [role for role in ("actor", "critic") if getattr(config, role).lora.rank]
    if not roles:
        return
    import torch
    from transformers import AutoModelForCausalLM

    from roll_lite.lora.adapters import target_modules, target_parameters
    from roll_lite.model.modeling import causal_lm_config
    from roll_lite.model.vision_run import is_vision_model, vision_config

    vision = is_vision_model(config.model)  # its language model's Linear modules (roll_lite/lora/vision.py)
    if isinstance(model_config, BuiltModel):
        model_config = (
            vision_config(config.model) if vision else causal_lm_config(config.model, model_config.vocab_size)
        )

    try:
        with torch.device("meta"):
            if vision:
                from transformers import AutoModelForImageTextToText

                lm = AutoModelForImageTextToText.from_config(model_config)
            else:
                lm = AutoModelForCausalLM.from_config(model_config, trust_remote_code=config.model.trust_remote_code)
    except ValueError as error:  # a model type that is not a causal LM (e.g. t5)
        key = "model.pretrained_path" if config.model.pretrained_path else "model.model_type"
        raise ConfigError(f"{key}: transformers builds no causal LM from it: {first_line(error)}") from None
    for role in roles:
        target_modules(getattr(config, role).lora, lm, key=f"{role}.lora")
        target_parameters(getattr(config, role).lora, lm, key=f"{role}.lora")


def _tokenizer(config: RunConfig) -> PreTrainedTokenizerBase:
    try:
        return run_tokenizer(config.model)
    except ValueError as error:
        message = str(error)
        if config.model.pretrained_path and config.model.tokenizer_path == config.model.pretrained_path:
            message = message.replace(
                "model.tokenizer_path:", "model.tokenizer_path (unset: model.pretrained_path's):", 1
            )
        raise ConfigError(message) from None


def _built_config(model, vocab_size: int) -> BuiltModel:
    """What the checks need of a model built from the `model` keys (causal_lm_config), its heads and
    model_type checked."""
    _check_heads(model.hidden_size, model.num_attention_heads, model.num_key_value_heads, "model.")
    if model.model_type not in CONFIG_MAPPING:
        raise ConfigError(
            f"model.model_type: '{model.model_type}' is not a model type of transformers (e.g. qwen2, llama)"
        )
    return BuiltModel(vocab_size, model.max_position_embeddings)


def _pretrained_config(model) -> PretrainedConfig:
    """The config.json of `model.pretrained_path` (a folder with weights, or a hub id), its heads checked."""
    path = model.pretrained_path
    try:
        where = locate(path, "model.pretrained_path", "model")
    except ValueError as error:
        raise ConfigError(str(error)) from None
    try:
        model_config = AutoConfig.from_pretrained(path, trust_remote_code=model.trust_remote_code)
    except Exception as error:  # OSError (missing / unreachable), ValueError (unknown type, remote code), JSON errors
        hint = " (set model.trust_remote_code=true if you trust it)" if "trust_remote_code" in str(error) else ""
        raise ConfigError(
            f"model.pretrained_path: cannot read the model config of the {where} '{path}': {first_line(error)}{hint}"
        ) from None
    heads = getattr(model_config, "num_attention_heads", None)
    kv_heads = getattr(model_config, "num_key_value_heads", None)
    if heads and kv_heads and heads % kv_heads:
        raise ConfigError(
            f"model.pretrained_path: its config.json has num_key_value_heads {kv_heads}, which does not "
            f"divide num_attention_heads {heads}"
        )
    return model_config


def _vision_folder(config: RunConfig, model_config: PretrainedConfig) -> BuiltModel:
    """A pretrained vision-language model: a local Qwen2.5-VL / Qwen3-VL folder whose processor agrees with its
    config.json (roll_lite/model/vision_folder.py); its language model's heads, vocabulary and positions."""
    from roll_lite.model.vision_folder import check_folder_processor, folder_vision_type, load_folder_processor

    m = config.model
    if folder_vision_type(m.pretrained_path) is None:
        raise ConfigError(
            f"model.pretrained_path: '{m.pretrained_path}' is a vision-language model's hub id; roll_lite reads one "
            "from a local folder only (download it, then give the folder)"
        )
    if m.tokenizer_path != m.pretrained_path:
        raise ConfigError(
            "model.tokenizer_path: a vision-language model's tokenizer is its folder's processor's "
            "(model.pretrained_path): leave it null"
        )
    if m.chat_template is not None:
        raise ConfigError(
            "model.chat_template: a vision-language model's chat template is its folder's processor's "
            "(model.pretrained_path), which renders the image parts: leave it null"
        )
    try:
        processor, source = load_folder_processor(str(m.pretrained_path), config.data)
        check_folder_processor(model_config, processor, source)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    text = model_config.get_text_config()
    _check_sequence_parallel(config, text)
    return BuiltModel(text.vocab_size, text.max_position_embeddings)


def _check_heads(hidden_size: int, heads: int, kv_heads: int, prefix: str) -> None:
    if heads < 1 or hidden_size % heads:
        raise ConfigError(f"{prefix}num_attention_heads: {heads} must divide {prefix}hidden_size {hidden_size}")
    if kv_heads < 1 or heads % kv_heads:
        raise ConfigError(f"{prefix}num_key_value_heads: {kv_heads} must divide {prefix}num_attention_heads {heads}")


def _check_positions(
    config: RunConfig, model_config: ModelConfig, longest_prompt: int | None, longest_demonstration: int = 0
) -> None:
    """The longest prompt (None before the data is read: a prompt has at least 1 token) plus
    rollout.max_new_tokens, and the longest SFT sequence (warm start or SFT pipeline), fit the model's positions."""
    limit = getattr(model_config, "max_position_embeddings", None)
    if limit is None:
        return
    key = "model.max_position_embeddings" if not config.model.pretrained_path else "the model's max_position_embeddings"
    new = config.rollout.max_new_tokens
    prompt_tokens = longest_prompt or 1
    if prompt_tokens + new > limit:
        where_prompts = "data.source" if config.data.source is not None else "data.train_files / data.eval_files"
        prompt = (
            "a prompt of at least 1 token"
            if longest_prompt is None
            else f"the longest prompt ({_tokens(longest_prompt)}, {where_prompts})"
        )
        raise ConfigError(
            f"rollout.max_new_tokens: {prompt} + rollout.max_new_tokens={new} = {prompt_tokens + new} "
            f"exceeds {key}={limit}"
        )
    if config.sft.steps and longest_demonstration > limit:
        raise ConfigError(
            f"sft.train_files: the SFT sequences (up to {longest_demonstration} tokens: prompt, response, "
            f"<eos>) exceed {key}={limit}; sft.max_length={limit} leaves the longer ones out"
        )


def _tokens(count: int) -> str:
    return f"{count} token" if count == 1 else f"{count} tokens"


def check_sequence_lengths(
    config: RunConfig, model_config: ModelConfig, longest_prompt: int, longest_demonstration: int
) -> None:
    """After the data is read (still before Ray): its longest prompt and warm-start sequence fit
    the model (`model_config`: what check_run returned)."""
    _check_positions(config, model_config, longest_prompt, longest_demonstration)


def _joins_a_cluster(config: RunConfig) -> bool:
    """ray_address / RAY_ADDRESS: the workers run on a cluster's nodes, not necessarily this machine."""
    return bool(config.ray_address or os.environ.get("RAY_ADDRESS"))


def _check_rollout_engine(config: RunConfig) -> None:
    """On a local cluster the rollout worker runs on this machine: its engine must be able to run
    here, and so must the judges' (reward.judge_engine). A joined cluster's GPU nodes are checked by
    the workers themselves."""
    from roll_lite.rewards.routing import all_sources
    from roll_lite.rollout import choose_engine

    if _joins_a_cluster(config):
        return
    on_gpu = config.workers.gpus_per_rank > 0
    try:
        choose_engine(config.rollout.engine, on_gpu=on_gpu)
        if all_sources(config.reward, "judges"):  # the reward worker runs the judges' engine here too
            choose_engine(config.reward.judge_engine, on_gpu=on_gpu, key="reward.judge_engine")
    except (RuntimeError, NotImplementedError, ValueError) as error:
        raise ConfigError(str(error)) from None


def _check_cpus(config: RunConfig) -> None:
    """A local cluster gets os.cpu_count() CPUs; a cluster joined through ray_address / RAY_ADDRESS is
    only known once connected, so start_ray checks it there (before any output is written). Under
    workers.backend=local nothing is reserved."""
    if _joins_a_cluster(config) or config.workers.backend == "local":
        return
    from roll_lite.workers.placement import reservation

    needed, available = reservation(config), os.cpu_count() or 1
    if needed.cpus > available:
        raise ConfigError(
            f"workers.actor_cpus: the workers reserve {needed.cpus:g} CPUs ({needed.cpus_from}) but this machine has "
            f"{available}; lower them (fractions are fine)"
        )
