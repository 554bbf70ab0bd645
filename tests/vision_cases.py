"""The image rows of the exactness matrix (test_exactness_vision.py): a tiny float64 Qwen2.5-VL (or Qwen3-VL:
VisionCase.model_type) trained by the real FSDP2 strategy in D gloo processes on a batch of conversations with 0, 1 or 2 images of different sizes,
against one forward/backward of the plain HF model (sdpa attention, transformers' own M-RoPE positions) over
the padded global batch."""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from dataclasses import dataclass

import numpy as np
import torch
from distributed_harness import _token_aligned, whole_gradients
from loss_cases import make_loss
from PIL import Image
from spawned_ranks import join_group, leave_group, spawn_ranks

from roll_lite.data import DataProto
from roll_lite.lora.adapters import add_adapters
from roll_lite.lora.settings import LoraSettings
from roll_lite.model.qwen3_vl import build_qwen3_vl_processor, tiny_qwen3_vl_config
from roll_lite.model.vision import build_vision_model, build_vision_processor, encode_conversation, tiny_vision_config
from roll_lite.strategy.vision_inputs import IMAGE_INPUTS

# (image sizes, response length) per row: 0, 1 or 2 images of 1 to 4 image tokens each
ROWS = [([(16, 16)], 6), ([(24, 8), (8, 8)], 5), ([], 7), ([(8, 16)], 4), ([(16, 16)], 5), ([], 3), ([(12, 12)], 6)]
MASK_KEYS = {"ppo": ["response_mask"], "ppo_kl": ["response_mask", "kl_mask"], "user": ["response_mask"]}
MASK_KEYS["value"] = ["response_mask"]  # the critic's value loss: FSDP2Strategy(head="value"), vision_heads.py
LORA = LoraSettings(rank=2, alpha=4.0)  # all-linear: every Linear layer of the language model
BUDGET = 60  # tokens per micro-batch in the token-budget case: at D = 2 the ranks need 2 and 1


@dataclass(frozen=True)
class VisionCase:
    loss: str
    mode: str
    world_size: int
    grad_accum_steps: int
    micro_batching: str  # padded | packed | budget
    freeze_vision: bool = False
    # a negative control: "pixels" (each micro-batch's pixels in the wrong row order), "1d" (1-D positions) or
    # "deepstack" (Qwen3-VL's DeepStack features of each micro-batch's images in reverse order); under
    # sequence parallelism "sp-columns" or "sp-tower" (sp_negative_control)
    naive: str = ""
    model_type: str = "qwen2_5_vl"  # or qwen3_vl
    lora: bool = False  # LORA's adapters on the language model, the base (the tower included) frozen
    sequence_parallel: int = 1  # S: world_size·S processes, each sequence split over S (vision_sp.py)

    @property
    def id(self) -> str:
        a = "budget" if self.micro_batching == "budget" else f"A{self.grad_accum_steps}-{self.micro_batching}"
        extra = ("-frozen" if self.freeze_vision else "") + (f"-naive-{self.naive}" if self.naive else "")
        extra += "-lora" if self.lora else ""
        extra += f"-S{self.sequence_parallel}" if self.sequence_parallel > 1 else ""
        family = "" if self.model_type == "qwen2_5_vl" else f"{self.model_type}-"
        return f"{family}{self.loss}-{self.mode}-D{self.world_size}-{a}{extra}"


def processor(model_type: str = "qwen2_5_vl"):
    build = build_qwen3_vl_processor if model_type == "qwen3_vl" else build_vision_processor
    return build(patch_size=4, merge_size=2, min_pixels=64, max_pixels=256)


def vision_lm(freeze_vision: bool = False, model_type: str = "qwen2_5_vl", lora: bool = False) -> torch.nn.Module:
    tiny = tiny_qwen3_vl_config if model_type == "qwen3_vl" else tiny_vision_config
    lm = build_vision_model(tiny(processor(model_type)), dtype=torch.float64, seed=0, freeze_vision=freeze_vision)
    if not lora:
        return lm
    lm = add_adapters(lm, LORA, seed=1)  # on the language model only (roll_lite/lora/vision.py)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():  # lora_B starts at zero, which would leave lora_A without a gradient
        for name, parameter in lm.named_parameters():
            if ".lora_B." in name:
                parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator, dtype=torch.float64))
    return lm


def vision_batch(model_type: str = "qwen2_5_vl") -> DataProto:
    """ROWS as prompts rendered by the processor (each placeholder expanded once) plus random responses of
    characters, right-padded; row 4's response mask is empty, kl_mask a random part of the response mask.
    Made once per process (its tensors are never written to); each call gets its own DataProto."""
    made = _vision_batch(model_type)
    return DataProto(made.batch, made.non_tensor_batch)


@functools.cache
def _vision_batch(model_type: str) -> DataProto:
    proc, generator = processor(model_type), torch.Generator().manual_seed(3)
    pixels = np.random.default_rng(5)
    prompts, inputs = [], []
    for sizes, _ in ROWS:
        images = [Image.fromarray(pixels.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]
        content = [{"type": "image"} for _ in images] + [{"type": "text", "text": "n?"}]
        encoded = encode_conversation(proc, [{"role": "user", "content": content}], images)
        prompts.append(encoded["input_ids"])
        inputs.append({key: encoded[key] for key in ("pixel_values", "image_grid_thw")} if images else None)
    characters = (4, 4 + 60)  # ids of the character tokenizer's characters: no special and no vision token
    lengths = [len(prompt) + response for prompt, (_, response) in zip(prompts, ROWS)]
    rows, width = len(ROWS), max(lengths)
    input_ids = torch.zeros(rows, width, dtype=torch.long)
    attention, response_mask = torch.zeros_like(input_ids), torch.zeros_like(input_ids)
    for row, (prompt, (_, response)) in enumerate(zip(prompts, ROWS)):
        tokens = torch.randint(*characters, (response,), generator=generator)
        input_ids[row, : lengths[row]] = torch.cat([prompt, tokens])
        attention[row, : lengths[row]] = 1
        response_mask[row, len(prompt) : lengths[row] - 1] = 1  # the last token predicts nothing
    response_mask[4] = 0
    kl_mask = response_mask * (torch.rand(rows, width, generator=generator) < 0.6).long()
    noise = lambda: torch.randn(rows, width, generator=generator, dtype=torch.float64)  # noqa: E731
    base = -torch.log(torch.tensor(64.0, dtype=torch.float64))
    batch = dict(input_ids=input_ids, attention_mask=attention, response_mask=response_mask, kl_mask=kl_mask)
    batch.update(old_log_probs=base + 0.3 * noise(), ref_log_probs=base + 0.3 * noise(), advantages=noise())
    batch["rollout_log_probs"] = base + 0.3 * noise()
    critic = torch.Generator().manual_seed(9)  # the critic's old values and returns (the value loss)
    batch.update(
        {key: torch.randn(rows, width, generator=critic, dtype=torch.float64) for key in ("values", "returns")}
    )
    return DataProto(batch, {IMAGE_INPUTS: inputs})


VALUES_OF = ("value", "qwen2_5_vl", False)  # the critic whose compute_values is checked: full, Qwen2.5-VL


def value_head_weights(model_type: str) -> dict[str, torch.Tensor]:
    """A non-zero value head (the critic's starts at zero, which would leave the trunk without a gradient)."""
    width = vision_lm(model_type=model_type).config.get_text_config().hidden_size
    weight = 0.2 * torch.randn(1, width, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    return {"value_head.weight": weight, "value_head.bias": torch.tensor([0.1], dtype=torch.float64)}


def loss_func(case: VisionCase):
    return make_loss(case.loss, case.mode)


@contextlib.contextmanager
def negative_control(naive: str):
    """The bugs the matrix must catch, patched into this rank's process."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    import roll_lite.model.vision as vision
    import roll_lite.strategy.micro_batches as micro_batches
    from roll_lite.strategy.vision_inputs import rows_images

    if naive.startswith("sp-"):
        with sp_negative_control(naive):
            yield
        return
    saved = (micro_batches.image_inputs, vision.mrope_layout, Qwen3VLModel.get_image_features)
    if naive == "pixels":

        def pixels_in_reverse_row_order(model, micro_batch):
            inputs = saved[0](model, micro_batch)
            if inputs:
                entries = rows_images(micro_batch)[::-1]
                inputs["pixel_values"] = torch.cat([entry["pixel_values"] for entry in entries])
            return inputs

        micro_batches.image_inputs = pixels_in_reverse_row_order
    elif naive == "1d":  # what transformers does, silently, when it is given no M-RoPE ids
        vision.mrope_layout = lambda lm, ids, positions, *rest: positions[None].expand(3, *positions.shape)
    elif naive == "deepstack":  # the main image features right, DeepStack's given to the wrong images' tokens

        def deepstack_in_reverse_image_order(self, *args, **kwargs):
            output = saved[2](self, *args, **kwargs)
            output.deepstack_features = [features[::-1] for features in output.deepstack_features]
            return output

        Qwen3VLModel.get_image_features = deepstack_in_reverse_image_order
    try:
        yield
    finally:
        micro_batches.image_inputs, vision.mrope_layout, Qwen3VLModel.get_image_features = saved


@contextlib.contextmanager
def sp_negative_control(naive: str):
    """Sequence parallelism's bugs (roll_lite/model/vision_sp.py): "sp-columns", each rank's image tokens take
    the micro-batch's first features (what merging after slicing the ids gives); "sp-tower", every rank's tower
    back-propagates the group's whole feature gradient undivided (the tower counted S times, the decoder right)."""
    import roll_lite.model.vision_sp as vision_sp
    from roll_lite.strategy.sequence_parallel import SequenceParallel, _WholeGradient

    saved = (vision_sp.columns_features, SequenceParallel.whole_gradient)
    if naive == "sp-columns":
        vision_sp.columns_features = lambda features, image_mask, columns: features[: int(image_mask[:, columns].sum())]
    elif naive == "sp-tower":
        SequenceParallel.whole_gradient = lambda self, x: _WholeGradient.apply(x, self.group, 1)
    try:
        yield
    finally:
        vision_sp.columns_features, SequenceParallel.whole_gradient = saved


def _rank_main(rank: int, world_size: int, port: int, cases: list[VisionCase], out_path: str):
    join_group(rank, world_size, port)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from roll_lite.strategy import FSDP2Strategy, StrategyConfig
    from roll_lite.strategy.micro_batches import data_parallel_groups, split_for_data_parallel

    results, strategies = {}, {}
    for case in cases:
        degree = case.sequence_parallel  # the S ranks of data-parallel group rank // S share its rows
        config = StrategyConfig(
            sequence_parallel=degree,
            grad_accum_steps=case.grad_accum_steps,
            use_packing=case.micro_batching != "padded",
            max_tokens_per_micro_batch=BUDGET if case.micro_batching == "budget" else None,
            lr=0.0,  # the weights stay as built: every case steps from the same ones
            max_grad_norm=None,
            param_dtype="float64",
            logprob_chunk_size=8,
        )
        head = "value" if case.loss == "value" else "log_probs"
        key = (repr(config), case.freeze_vision, case.model_type, case.lora, head)
        if key not in strategies:
            lm = vision_lm(case.freeze_vision, case.model_type, case.lora)
            strategies[key] = FSDP2Strategy(lm, config, head=head)
            if head == "value":
                options = StateDictOptions(full_state_dict=True, strict=False)
                set_model_state_dict(strategies[key].model, value_head_weights(case.model_type), options=options)
        strategy = strategies[key]
        data = vision_batch(case.model_type)
        data.meta_info["loss_mask_keys"] = MASK_KEYS[case.loss]
        share = split_for_data_parallel(data, world_size // degree, balance_tokens=config.use_packing)[rank // degree]
        with negative_control(case.naive):
            metrics = strategy.train_step(share, loss_func(case))
        results[case] = (metrics["loss"], whole_gradients(strategy.model), metrics["num_micro_batches"])
    # compute_log_probs (the old and reference log-probs) with images: rank 0's rows, packed in 2 micro-batches
    packed = next(
        (
            s
            for (_, frozen, family, lora, head), s in strategies.items()
            if s.config.use_packing
            and head == "log_probs"
            and s.config.sequence_parallel == 1
            and not (frozen or lora or family != "qwen2_5_vl")
        ),
        None,
    )
    if packed is not None:
        data = vision_batch()
        rows = data_parallel_groups(data, world_size, balance_tokens=True)[rank]
        results["log_probs"] = (rows, packed.compute_log_probs(data.index_select(rows))["log_probs"])
    critic = [s for (_, _, family, lora, head), s in strategies.items() if (head, family, lora) == VALUES_OF]
    if critic:  # compute_values (the critic's pass before GAE) with images: rank 0's rows, packed
        data = vision_batch()
        rows = data_parallel_groups(data, world_size, balance_tokens=True)[rank]
        results["values"] = (rows, critic[0].compute_values(data.index_select(rows))["values"])
    sp = [s for s in strategies.values() if s.config.sequence_parallel > 1 and s.config.use_packing]
    if sp:  # the same at S = 2 (D = 1): every row, each split over the two ranks
        results["log_probs_sp"] = sp[0].compute_log_probs(vision_batch())["log_probs"]
    if rank == 0:
        torch.save(results, out_path)
    leave_group()


def run_vision_strategy(cases: list[VisionCase]) -> dict:
    """{case: (loss, grads, micro-batches)} and {("log_probs", D): (rank 0's rows, their log-probs)}, one spawn
    per D."""
    results = {}
    for world_size in sorted({c.world_size * c.sequence_parallel for c in cases}):
        with tempfile.TemporaryDirectory() as tmp:
            out_path = os.path.join(tmp, "results.pt")
            group = [c for c in cases if c.world_size * c.sequence_parallel == world_size]
            spawn_ranks(_rank_main, world_size, group, out_path, start_method="forkserver")
            found = torch.load(out_path, weights_only=False)
            for name in ("log_probs", "values"):
                if name in found:
                    found[(name, world_size)] = found.pop(name)
            results.update(found)
    return results


def global_inputs(lm: torch.nn.Module, data: DataProto) -> dict:
    """The plain HF model's inputs for one forward over the padded global batch: every row's images in row order,
    and mm_token_type_ids, from which transformers lays out M-RoPE itself (without them it silently uses 1-D
    positions)."""
    entries = [entry for entry in data.non_tensor_batch[IMAGE_INPUTS] if entry is not None]
    ids = data.batch["input_ids"]
    return dict(
        input_ids=ids,
        attention_mask=data.batch["attention_mask"],
        pixel_values=torch.cat([entry["pixel_values"] for entry in entries]),
        image_grid_thw=torch.cat([entry["image_grid_thw"] for entry in entries]),
        mm_token_type_ids=(ids == lm.config.image_token_id).int(),
        use_cache=False,
    )


def vision_reference(
    loss: str, mode: str, freeze_vision: bool = False, model_type: str = "qwen2_5_vl", lora: bool = False
) -> tuple[float, dict, torch.Tensor]:
    """(loss, grads, token-aligned log-probs) of one forward/backward of the plain HF model (lora: with peft's
    adapters) over the padded global batch: eager
    attention, all the batch's images in row order, M-RoPE positions computed by transformers itself."""
    lm = vision_lm(freeze_vision, model_type, lora)
    lm.set_attn_implementation("sdpa")  # eager: softmax in float32, even for float64
    data = vision_batch(model_type)
    batch = dict(data.batch)
    ids, attention = batch["input_ids"], batch["attention_mask"]
    logits = lm(**global_inputs(lm, data)).logits
    log_softmax = torch.log_softmax(logits, dim=-1)
    next_log_probs = log_softmax[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    next_entropy = -(log_softmax.exp() * log_softmax).sum(-1)[:, :-1]
    output = {
        "log_probs": _token_aligned(next_log_probs, attention),
        "entropy": _token_aligned(next_entropy, attention),
    }
    meta = {"batch_num_tokens": {}, "global_valid_samples": {}}
    for key in MASK_KEYS[loss]:
        mask = batch[key].bool()
        meta["batch_num_tokens"][key] = mask.sum().double()
        meta["global_valid_samples"][key] = (mask.sum(-1) > 0).sum().double()
    value, _ = make_loss(loss, mode)(DataProto(batch, meta_info=meta), output)
    value.backward()
    grads = {n: p.grad for n, p in lm.named_parameters() if p.requires_grad}
    return value.item(), grads, output["log_probs"].detach()


def value_reference(model_type: str = "qwen2_5_vl", lora: bool = False) -> tuple[float, dict, torch.Tensor]:
    """(value loss, grads, token-aligned values) of one forward/backward of the plain HF trunk (lora: LORA's
    adapters on it, the base frozen) over the padded global batch, all its images in row order, the value head
    applied by hand to its final hidden states."""
    lm = vision_lm(freeze_vision=lora, model_type=model_type, lora=lora)
    lm.set_attn_implementation("sdpa")
    data = vision_batch(model_type)
    batch = dict(data.batch)
    attention = batch["attention_mask"]
    hidden = lm.model(**global_inputs(lm, data)).last_hidden_state
    head = {name: w.clone().requires_grad_() for name, w in value_head_weights(model_type).items()}
    next_values = hidden[:, :-1] @ head["value_head.weight"][0] + head["value_head.bias"][0]
    output = {"values": _token_aligned(next_values, attention)}
    mask = batch["response_mask"].bool()
    meta = {"batch_num_tokens": {"response_mask": mask.sum().double()}}
    meta["global_valid_samples"] = {"response_mask": (mask.sum(-1) > 0).sum().double()}
    value, _ = make_loss("value", "token-mean")(DataProto(batch, meta_info=meta), output)
    value.backward()
    grads = {n: p.grad for n, p in lm.named_parameters() if p.grad is not None} | {n: w.grad for n, w in head.items()}
    return value.item(), grads, output["values"].detach()
