"""The SFT and DPO rows of the exactness matrix on images (docs/vision.md, "SFT and DPO on image rows"): the tiny
float64 Qwen2.5-VL of vision_cases.py, trained by the real FSDP2 strategy in D ∈ {1, 2} gloo processes × A ∈ {1, 2} ×
padded / packed, gives the loss and every gradient (the vision tower's included) of one forward/backward of the
plain HF model over the padded global batch (sdpa attention, transformers' own M-RoPE positions), relative error
≤ 1e-10:

- the SFT loss (token-mean NLL over a target mask with holes) on vision_cases.py's conversations with 0, 1 or 2
  images;
- DPO (cDPO's smoothing and an NLL term, as pair_cases.py's) on pairs of prompts with 0, 1 or 2 images, laid out
  by the pipelines' build_pair_batch: each side's row carries its prompt's image inputs, a pair stays on one rank
  and in one micro-batch, and the loss reads the reference's summed log-probs.

Negative control: the DPO step with each micro-batch's pixels in reverse row order (the grids right) must miss.
"""

from __future__ import annotations

import functools
import os
import tempfile
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from distributed_harness import _token_aligned, whole_gradients
from loss_cases import make_loss
from pair_cases import make_pair_loss
from PIL import Image
from spawned_ranks import join_group, leave_group, spawn_ranks
from vision_cases import global_inputs, negative_control, processor, vision_batch, vision_lm

from roll_lite.data import DataProto
from roll_lite.data.pairs import PAIR_MASK_KEYS, PairData, build_pair_batch
from roll_lite.loss.checker import relative_deviation
from roll_lite.model.vision import encode_conversation
from roll_lite.strategy.vision_inputs import IMAGE_INPUTS

MASK_KEYS = {"sft": ["kl_mask"], "dpo": list(PAIR_MASK_KEYS)}  # SFT: a target mask with holes (loss_cases.py)
# (image sizes of the prompt, chosen and rejected response lengths) per pair: 1, 2, 0 and 1 images
PAIRS = [([(16, 16)], 5, 3), ([(24, 8), (8, 8)], 2, 6), ([], 4, 4), ([(8, 16)], 6, 1)]
CHARACTERS = (4, 4 + 60)  # the character tokenizer's characters: no special and no vision token


@dataclass(frozen=True)
class Case:
    loss: str  # sft | dpo
    world_size: int
    grad_accum_steps: int
    packed: bool
    naive: str = ""  # "pixels": each micro-batch's pixels in reverse row order (vision_cases.negative_control)

    @property
    def id(self) -> str:
        return f"{self.loss}-D{self.world_size}-A{self.grad_accum_steps}-{'packed' if self.packed else 'padded'}" + (
            f"-naive-{self.naive}" if self.naive else ""
        )


CASES = [
    Case(loss, d, a, packed) for loss in ("sft", "dpo") for d in (1, 2) for a in (1, 2) for packed in (False, True)
]
NAIVE = [Case("dpo", 1, 2, True, naive="pixels")]


def pair_batch() -> DataProto:
    """PAIRS: prompts rendered by the processor (each placeholder expanded once) + random responses, laid out by
    build_pair_batch; reference_logps random. Each call gets its own DataProto."""
    made = _pair_batch()
    return DataProto(made.batch, made.non_tensor_batch, dict(made.meta_info))


@functools.cache
def _pair_batch() -> DataProto:
    proc, generator, pixels = processor(), torch.Generator().manual_seed(4), np.random.default_rng(6)
    sides: tuple[list, list] = ([], [])
    inputs = []
    for sizes, *lengths in PAIRS:
        images = [Image.fromarray(pixels.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]
        content = [{"type": "image"} for _ in images] + [{"type": "text", "text": "n?"}]
        encoded = encode_conversation(proc, [{"role": "user", "content": content}], images)
        prompt = encoded["input_ids"].tolist()
        inputs.append({key: encoded[key] for key in ("pixel_values", "image_grid_thw")} if images else None)
        for side, length in zip(sides, lengths):
            response = torch.randint(*CHARACTERS, (length,), generator=generator).tolist()
            side.append((prompt + response, [0] * len(prompt) + [1] * length))
    batch = build_pair_batch(PairData(*sides, images=inputs), proc.tokenizer.pad_token_id)
    targets = (batch["chosen_mask"] + batch["rejected_mask"]).sum(-1).double()
    noise = torch.randn(len(batch), generator=generator, dtype=torch.float64)
    batch.batch["reference_logps"] = -np.log(64.0) * targets + noise
    return batch


def case_batch(loss: str) -> DataProto:
    data = pair_batch() if loss == "dpo" else vision_batch()
    data.meta_info["loss_mask_keys"] = MASK_KEYS[loss]
    return data


def loss_func(loss: str):
    return make_pair_loss("dpo") if loss == "dpo" else make_loss("sft", "token-mean")


def _rank_main(rank: int, world_size: int, port: int, cases: list[Case], out_path: str):
    join_group(rank, world_size, port)
    from roll_lite.strategy import FSDP2Strategy, StrategyConfig
    from roll_lite.strategy.micro_batches import split_for_data_parallel

    results, strategies = {}, {}
    for case in cases:
        config = StrategyConfig(
            grad_accum_steps=case.grad_accum_steps,
            use_packing=case.packed,
            lr=0.0,  # the weights stay as built: every case steps from the same ones
            max_grad_norm=None,
            param_dtype="float64",
            logprob_chunk_size=8,
        )
        if repr(config) not in strategies:
            strategies[repr(config)] = FSDP2Strategy(vision_lm(), config)
        data = case_batch(case.loss)
        share = split_for_data_parallel(data, world_size, balance_tokens=config.use_packing)[rank]
        with negative_control(case.naive):
            metrics = strategies[repr(config)].train_step(share, loss_func(case.loss))
        results[case] = (metrics["loss"], whole_gradients(strategies[repr(config)].model))
    if rank == 0:
        torch.save(results, out_path)
    leave_group()


@pytest.fixture(scope="module")
def strategy_results() -> dict:
    """{case: (loss, grads)}, one spawn per D."""
    results = {}
    for world_size in (1, 2):
        with tempfile.TemporaryDirectory() as tmp:
            out_path = os.path.join(tmp, "results.pt")
            group = [c for c in CASES + NAIVE if c.world_size == world_size]
            spawn_ranks(_rank_main, world_size, group, out_path, start_method="forkserver")
            results.update(torch.load(out_path, weights_only=False))
    return results


@functools.cache
def reference(loss: str) -> tuple[float, dict]:
    """(loss, grads) of one forward/backward of the plain HF model over the padded global batch, all its images in
    row order, M-RoPE positions computed by transformers itself."""
    lm = vision_lm()
    lm.set_attn_implementation("sdpa")
    data = case_batch(loss)
    batch = dict(data.batch)
    ids, attention = batch["input_ids"], batch["attention_mask"]
    logits = lm(**global_inputs(lm, data)).logits
    next_log_probs = torch.log_softmax(logits, dim=-1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    output = {"log_probs": _token_aligned(next_log_probs, attention)}
    meta = {"batch_num_tokens": {}, "global_valid_samples": {}}
    for key in MASK_KEYS[loss]:
        mask = batch[key].bool()
        meta["batch_num_tokens"][key] = mask.sum().double()
        meta["global_valid_samples"][key] = (mask.sum(-1) > 0).sum().double()
    value, _ = loss_func(loss)(DataProto(batch, meta_info=meta), output)
    value.backward()
    return value.item(), {n: p.grad for n, p in lm.named_parameters() if p.requires_grad}


def errors(case: Case, strategy_results: dict) -> tuple[float, float]:
    (loss, grads), (ref_loss, ref_grads) = strategy_results[case], reference(case.loss)
    assert set(grads) == set(ref_grads), set(grads) ^ set(ref_grads)
    return relative_deviation(loss, ref_loss), max(relative_deviation(grads[n], ref_grads[n]) for n in ref_grads)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_sft_and_dpo_steps_with_images_equal_the_global_forward_backward(case, strategy_results):
    loss_error, grad_error = errors(case, strategy_results)
    assert loss_error <= 1e-10 and grad_error <= 1e-10, (loss_error, grad_error)
    assert any(name.startswith("model.visual.") for name in strategy_results[case][1])  # the tower is trained


@pytest.mark.parametrize("case", NAIVE, ids=[c.id for c in NAIVE])
def test_dpo_with_misplaced_pixels_misses(case, strategy_results):
    loss_error, grad_error = errors(case, strategy_results)
    assert loss_error > 1e-6 and grad_error > 1e-6, (loss_error, grad_error)


def test_the_pair_batch_shares_each_prompts_images_and_masks_no_image_token():
    data = pair_batch()
    entries = data.non_tensor_batch[IMAGE_INPUTS]
    assert [entry is None for entry in entries] == [False] * 4 + [True] * 2 + [False] * 2
    for row in range(0, len(data), 2):
        assert entries[row] is entries[row + 1]  # the chosen and the rejected side: one prompt, its images
    image_tokens = data["input_ids"] == processor().image_token_id
    assert image_tokens.sum() == 2 * (4 + 3 + 1 + 2)  # each image's tokens, expanded once, on both sides
    assert not any((data[key].bool() & image_tokens).any() for key in PAIR_MASK_KEYS)
