"""What a weight sync of the vllm engine (vllm_engine.py) sends and how vLLM loads it: the HF-named
tensors in memory (vllm_weights, checked against checkpoint_names), the worker extension that reloads
them in every vLLM worker (LoadWeightsInMemory), and the rank of a LoRA adapter folder (adapter_rank)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch


def vllm_weights(state_dict: dict[str, torch.Tensor], tie_word_embeddings: bool) -> list[tuple[str, torch.Tensor]]:
    """(HF name, tensor) pairs for vLLM's `load_weights`: the names a HF checkpoint of the model holds,
    in the state dict's order (each layer's tensors together). With tied embeddings the checkpoint has
    no lm_head (vLLM ties it to the embedding), so it is not sent."""
    return [
        (name, tensor) for name, tensor in state_dict.items() if not (tie_word_embeddings and name == "lm_head.weight")
    ]


def checkpoint_names(hf_config) -> list[str]:
    """The tensor names `save_pretrained` writes for a model of `hf_config` (built on the meta device:
    no memory, no weights), without the LM head when it is tied to the embedding."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from roll_lite.rollout.vllm_images import is_vision_config

    with torch.device("meta"):  # a vision-language model: its vision tower's names too
        model = (AutoModelForImageTextToText if is_vision_config(hf_config) else AutoModelForCausalLM).from_config(
            hf_config
        )
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    return [name for name, _ in vllm_weights(model.state_dict(), tied)]


class LoadWeightsInMemory:
    """vLLM worker extension (`worker_extension_cls`): methods `collective_rpc` calls on every vLLM
    worker. vLLM mixes this class into its worker (GPU or CPU), which provides `get_model()` and
    `vllm_config`."""

    if TYPE_CHECKING:  # what vLLM's worker, which this class is mixed into, provides
        vllm_config: Any

        def get_model(self) -> Any: ...

    def roll_lite_load_weights(
        self, weights: list[tuple[str, torch.Tensor]], tie_word_embeddings: bool, language_model_only: bool = False
    ) -> list[str]:
        """Reload HF-named tensors in place; returns the parameters that were not loaded (vLLM's
        names), which the engine treats as an error.

        After loading, vLLM processes each layer's weights into its kernels' format (on CPU: packs
        them for oneDNN and empties `layer.weight`), so calling `load_weights` again would not reach
        them. vLLM's layer-wise reload gives each layer its checkpoint-format parameters back, loads,
        and processes them again. A tied LM head loads nothing of its own (its weight is the
        embedding's), so the reload leaves its processed copy as it was: it is processed again here
        (on CPU its packed head would otherwise keep the old embedding; on GPU this does nothing).

        `language_model_only` (a vision-language model whose vision tower is frozen): only the language
        model's layers are reloaded, and only its parameters must be loaded; the tower keeps its weights."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        model = self.get_model()
        part = model.get_language_model() if language_model_only else model
        prefix = next(name for name, module in model.named_modules() if module is part)
        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(part)
            loaded = model.load_weights(weights=weights)
            finalize_layerwise_reload(part, self.vllm_config.model_config)
            if tie_word_embeddings:  # a vision-language model's head is its language model's
                head = (model.get_language_model() if hasattr(model, "get_language_model") else model).lm_head
                head.quant_method.process_weights_after_loading(head)
        # with LoRA on, vLLM wraps each adapted layer (its weights under `base_layer`) but loads by the
        # unwrapped names; the adapters' own tensors are no parameters
        lora = self.vllm_config.lora_config is not None
        names = {name.replace(".base_layer.", ".") if lora else name for name, _ in part.named_parameters(prefix)}
        return sorted(names - set(loaded))


def adapter_rank(folder: str) -> int:
    """The largest LoRA rank of the PEFT adapter in `folder` (its `r`, or a larger one in `rank_pattern`)."""
    import json

    config_file = os.path.join(folder, "adapter_config.json")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(
            f"rollout adapter sync: {folder} holds no adapter_config.json (a PEFT adapter folder, "
            "as PeftModel.save_pretrained writes, is expected)"
        )
    with open(config_file) as file:
        config = json.load(file)
    return max([int(config["r"]), *(int(r) for r in (config.get("rank_pattern") or {}).values())])
