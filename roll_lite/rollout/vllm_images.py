"""Prompts with images in the vllm engine (vllm_engine.py): vLLM's own Qwen2.5-VL or Qwen3-VL, fed the
processor's pixel_values, each image's tokens in the ids it runs exactly as the trainer holds them.

- The model: vLLM 0.32's (its vision tower and M-RoPE decoder), registered here under an architecture name
  of roll_lite's (`VLLM_ARCHITECTURES`, vLLM's out-of-tree model API) with its input side changed: the HF
  processor is the run's, made locally and handed over in this process (vLLM's would load a video
  processor, which needs torchvision), and images only. An image arrives as the processor's output
  {pixel_values, image_grid_thw} (vLLM's processed-inputs path, `enable_mm_embeds`): vLLM runs its vision
  tower on it and does not resize or normalise it again (`mm_device_do_normalize=False`: by default vLLM
  0.32 normalises these models' pixels in the tower's input instead of the processor, so the processor's
  outputs would be normalised twice: image features off by ~0.05 on the tiny model).
- Placeholders: vLLM's processor always expands each `<|image_pad|>` it is given into the image's
  grid_t·grid_h·grid_w / merge² tokens (vllm/multimodal/processing/processor.py `_apply_prompt_updates`
  does not look for an expansion already there), so ids that hold the expansion would be expanded twice,
  and vLLM runs them without an error (an image of 4 tokens: 7 image tokens, 4 of them features). The
  engine hands it each image's run folded back to one placeholder (`folded_prompt`) and checks that the
  ids vLLM ran are the ids given, token for token (`check_engine_ids`): vLLM's expansion must be the
  processor's.
- torchvision: vLLM's qwen2_vl module (which qwen2_5_vl and qwen3_vl import) imports `smart_resize` from
  transformers' torchvision image processor module (vllm/model_executor/models/qwen2_vl.py, line 43),
  which fails to import without torchvision; vLLM's CPU install has none (scripts/setup.sh removes the
  registry's CUDA builds, which do not load against torch's CPU build). Transformers' PIL image processor
  module defines the same function: without torchvision, `register_vision_model` makes the missing module
  that one name of it.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import types
from typing import Any, Sequence

import torch

from roll_lite.rollout.images import check_expanded_once, image_token_count

# vLLM's model of each vision-language family, registered under a name of roll_lite's (register_vision_model)
VLLM_ARCHITECTURES = {
    "qwen2_5_vl": "RollLiteQwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "RollLiteQwen3VLForConditionalGeneration",
}
VISION_MODEL_TYPES = tuple(VLLM_ARCHITECTURES)
VISION_TOWER_PREFIX = "model.visual."  # the vision tower's (and its merger's) names in a HF checkpoint
MAX_IMAGES_PER_PROMPT = 8  # vLLM's limit_mm_per_prompt: a prompt with more images is refused by vLLM


def is_vision_config(hf_config) -> bool:
    return getattr(hf_config, "model_type", None) in VISION_MODEL_TYPES


def folded_prompt(
    ids: Sequence[int], image_grid_thw: torch.Tensor | None, image_token_id: int, merge: int
) -> list[int]:
    """`ids` (each image's tokens expanded once, check_expanded_once) with each image's run of image tokens
    folded back to the one placeholder vLLM's processor expands. Each run must be exactly its image's size:
    two images' runs side by side could not be told apart and are refused."""
    check_expanded_once(torch.as_tensor(list(ids)), image_grid_thw, image_token_id, merge)
    sizes = [] if image_grid_thw is None else image_token_count(image_grid_thw, merge)
    folded: list[int] = []
    position, image = 0, 0
    while position < len(ids):
        if ids[position] != image_token_id:
            folded.append(ids[position])
            position += 1
            continue
        run = position
        while run < len(ids) and ids[run] == image_token_id:
            run += 1
        if run - position != sizes[image]:
            raise ValueError(
                f"image {image}'s tokens at position {position}: a run of {run - position} image tokens where its "
                f"grid needs {sizes[image]} (each image's tokens must stand apart, between its vision markers)"
            )
        folded.append(image_token_id)
        position, image = run, image + 1
    return folded


def image_request(ids: Sequence[int], entry: dict | None, image_token_id: int, merge: int) -> dict[str, Any]:
    """vLLM's prompt dict for one prompt: the folded ids and its images' pixel_values and grids."""
    if entry is None:
        folded_prompt(ids, None, image_token_id, merge)  # a text prompt holds no image token
        return {"prompt_token_ids": list(ids)}
    grid = entry["image_grid_thw"]
    return {
        "prompt_token_ids": folded_prompt(ids, grid, image_token_id, merge),
        "multi_modal_data": {"image": {"pixel_values": entry["pixel_values"], "image_grid_thw": grid}},
    }


def check_engine_ids(outputs: Sequence, prompts: Sequence[Sequence[int]]) -> None:
    """The ids vLLM ran (each RequestOutput's prompt_token_ids, after its processor) are the prompts' ids."""
    for index, (output, prompt) in enumerate(zip(outputs, prompts)):
        ran = list(output.prompt_token_ids or [])
        if ran != list(prompt):
            first = next((i for i, (a, b) in enumerate(zip(ran, prompt)) if a != b), min(len(ran), len(prompt)))
            raise RuntimeError(
                f"vllm ran prompt {index} as {len(ran)} ids where the trainer holds {len(prompt)}, first "
                f"difference at position {first}: its image placeholders were not expanded exactly once"
            )


def prepare_config_folder(hf_config, folder: str, processor) -> dict[str, Any]:
    """Write what vLLM reads for the run's vision-language model into `folder` (config.json naming
    its VLLM_ARCHITECTURES name, the tokenizer) and keep `processor` for its input processor; returns vllm.LLM's
    extra arguments."""
    import copy

    register_vision_model()
    _PROCESSORS[folder] = processor
    named = copy.deepcopy(hf_config)
    named.architectures = [VLLM_ARCHITECTURES[hf_config.model_type]]
    named.save_pretrained(folder)
    processor.tokenizer.save_pretrained(folder)  # vLLM's input processor loads the tokenizer from here
    # the processor's tokenizer is vLLM's input processor's (the prompts stay token ids, never detokenized).
    # mm_device_do_normalize: vLLM's default for Qwen2.5-VL moves the processor's rescale and normalisation
    # into the vision tower's input; the pixel_values given are normalised already, and would be twice
    return dict(
        skip_tokenizer_init=False,
        enable_mm_embeds=True,
        limit_mm_per_prompt={"image": MAX_IMAGES_PER_PROMPT},
        mm_device_do_normalize=False,
    )


# the run's processor of each engine started in this process, by its config folder (vLLM's model path)
_PROCESSORS: dict[str, Any] = {}


@functools.lru_cache(maxsize=1)
def register_vision_model() -> None:
    """Register VLLM_ARCHITECTURES with vLLM in this process (once)."""
    if importlib.util.find_spec("torchvision") is None:
        from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as pil

        missing = types.ModuleType("transformers.models.qwen2_vl.image_processing_qwen2_vl")
        missing.smart_resize = pil.smart_resize  # type: ignore[attr-defined]
        sys.modules.setdefault(missing.__name__, missing)
    from vllm import ModelRegistry
    from vllm.model_executor.models import qwen2_5_vl, qwen2_vl, qwen3_vl
    from vllm.multimodal import MULTIMODAL_REGISTRY

    class ProcessedImages(qwen2_vl.Qwen2VLMultiModalDataParser):
        """An image given as a dict is the processor's output: pixel_values sized by image_grid_thw."""

        embedding_fields = {"image": {"pixel_values": "values", "image_grid_thw": "metadata"}}

    families = {  # model type: vLLM's processing info, multimodal processor, dummy inputs, model
        "qwen2_5_vl": (
            qwen2_5_vl.Qwen2_5_VLProcessingInfo,
            qwen2_5_vl.Qwen2_5_VLMultiModalProcessor,
            qwen2_vl.Qwen2VLDummyInputsBuilder,
            qwen2_5_vl.Qwen2_5_VLForConditionalGeneration,
        ),
        "qwen3_vl": (
            qwen3_vl.Qwen3VLProcessingInfo,
            qwen3_vl.Qwen3VLMultiModalProcessor,
            qwen3_vl.Qwen3VLDummyInputsBuilder,
            qwen3_vl.Qwen3VLForConditionalGeneration,
        ),
    }
    for model_type, (info, processor, dummy_inputs, model) in families.items():

        class LocalProcessing(info):  # type: ignore[valid-type, misc]
            def get_hf_processor(self, **kwargs: object):
                return _PROCESSORS[self.ctx.model_config.model]

            def get_supported_mm_limits(self):
                return {"image": None}

            def get_supported_mm_processor_kwargs(self):  # images only: no video processor to ask
                return qwen2_vl.Qwen2VLProcessingInfo.get_supported_mm_processor_kwargs(self)

            def get_mm_max_tokens_per_item(self, seq_len, mm_counts):
                return {"image": self.get_max_image_tokens()}

            def get_data_parser(self):
                return ProcessedImages(self.get_hf_config().vision_config.spatial_merge_size)

        registered = MULTIMODAL_REGISTRY.register_processor(processor, info=LocalProcessing, dummy_inputs=dummy_inputs)
        name = VLLM_ARCHITECTURES[model_type]
        ModelRegistry.register_model(name, registered(type(name, (model,), {})))


def engine_images(hf_config, excluded_token_ids: Sequence[int]) -> dict[str, Any]:
    """VLLMEngine's `images` for a vision-language model: its image token, merge size, and the ids it may
    sample (all but `excluded_token_ids`, the vision tokens the policy head leaves out too)."""
    excluded = set(excluded_token_ids)
    return {
        "image_token_id": int(hf_config.image_token_id),
        "merge_size": int(hf_config.vision_config.spatial_merge_size),
        "allowed_token_ids": [i for i in range(hf_config.text_config.vocab_size) if i not in excluded],
    }
