"""The MoE rows of the exactness matrix (test_exactness_moe.py): a tiny float64 Qwen3-MoE trained by the real
FSDP2 strategy in D gloo processes with the PPO + KL loss plus the load-balancing and z-losses
(roll_lite/loss/aux.py), against one forward/backward of the plain HF model over the global batch; the LoRA rows
train peft's adapters on the attention and on the experts' fused weights (the base frozen) against peft's model."""

from __future__ import annotations

import copy
import os
import tempfile
from dataclasses import dataclass

import torch
from distributed_harness import _policy_output, whole_gradients
from loss_cases import BUDGET, MASK_KEYS, global_batch, make_loss
from spawned_ranks import join_group, leave_group, spawn_ranks

from roll_lite.data import DataProto
from roll_lite.lora.adapters import add_adapters
from roll_lite.lora.settings import LoraSettings
from roll_lite.loss.aux import load_balancing_loss, moe_aux_loss_func, router_z_loss
from roll_lite.model.modeling import build_causal_lm
from roll_lite.model.moe import expert_counts, moe_routers, routing

MOE_MODEL = dict(model_type="qwen3_moe", vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16)
MOE_MODEL.update(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4)
MOE_MODEL.update(num_experts_per_tok=2, norm_topk_prob=True)
AUX_COEF, Z_COEF = 0.5, 0.1
LOSS = ("ppo_kl", "token-mean")
LORA = LoraSettings(rank=2, alpha=4.0, target_modules="all-linear", target_parameters="experts")


@dataclass(frozen=True)
class MoeCase:
    world_size: int
    grad_accum_steps: int
    packed: bool
    naive: bool = False  # aux losses from each micro-batch's own counts and tokens, averaged (what not to do)
    budget: bool = False  # token-budget micro-batches (packed): at D = 2 the ranks need 2 and 1 (placeholder passes)
    lora: bool = False  # LoRA on the attention and the experts (LORA), the base frozen

    @property
    def id(self) -> str:
        batching = "budget" if self.budget else f"A{self.grad_accum_steps}-{'packed' if self.packed else 'padded'}"
        return f"D{self.world_size}-{batching}" + ("-naive" if self.naive else "") + ("-lora" if self.lora else "")


def moe_lm(lora: bool = False) -> torch.nn.Module:
    lm = build_causal_lm(MOE_MODEL, dtype=torch.float64, seed=0)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():  # transformers initialises routers to zero: give them a routing worth testing
        for router in moe_routers(lm):
            router.weight.copy_(torch.randn(router.weight.shape, generator=generator, dtype=torch.float64))
    if not lora:
        return lm
    lm = add_adapters(lm, LORA, seed=1)
    with torch.no_grad():  # lora_B starts at zero, which would leave lora_A without a gradient
        for name, parameter in lm.named_parameters():
            if ".lora_B." in name:
                parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator, dtype=torch.float64))
    return lm


def naive_loss_func(loss_func):
    """The per-micro-batch way: counts and token count of this micro-batch alone, the loss averaged over the
    D·A micro-batches (meta_info['loss_scale'] = D·A)."""

    def naive(batch, output):
        loss, metrics = loss_func(batch, output)
        logits = output["router_logits"]
        flat = logits.permute(2, 0, 1, 3).reshape(logits.shape[2], -1, logits.shape[3])
        mask = batch["attention_mask"]
        experts = torch.topk(torch.softmax(logits, dim=-1), MOE_MODEL["num_experts_per_tok"], dim=-1).indices
        counts = expert_counts(experts, mask, MOE_MODEL["num_experts"])
        tokens, parts = float(mask.sum()), float(batch.meta_info["loss_scale"])
        aux = AUX_COEF * load_balancing_loss(flat, mask, counts, tokens) + Z_COEF * router_z_loss(flat, mask, tokens)
        return loss + aux / parts, metrics

    return naive


def case_loss(case: MoeCase):
    policy = make_loss(*LOSS)
    return naive_loss_func(policy) if case.naive else moe_aux_loss_func(policy, AUX_COEF, Z_COEF)


def _rank_main(rank: int, world_size: int, port: int, cases: list[MoeCase], out_path: str):
    join_group(rank, world_size, port)
    from roll_lite.strategy import FSDP2Strategy, StrategyConfig
    from roll_lite.strategy.micro_batches import split_for_data_parallel

    results, strategies = {}, {}
    for case in cases:
        config = StrategyConfig(
            grad_accum_steps=case.grad_accum_steps,
            use_packing=case.packed,
            max_tokens_per_micro_batch=BUDGET if case.budget else None,
            lr=0.0,  # the weights stay as built: every case steps from the same ones
            max_grad_norm=None,
            param_dtype="float64",
            logprob_chunk_size=8,
        )
        key = (repr(config), case.lora)
        if key not in strategies:
            strategies[key] = FSDP2Strategy(moe_lm(case.lora), config)
        strategy = strategies[key]
        data = global_batch(torch.float64)
        data.meta_info.update(loss_mask_keys=MASK_KEYS[LOSS[0]], moe_aux_losses=True)
        share = split_for_data_parallel(data, world_size, balance_tokens=case.packed)[rank]
        metrics = strategy.train_step(share, case_loss(case))
        results[case] = (metrics["loss"], whole_gradients(strategy.model), metrics)
    if rank == 0:
        torch.save(results, out_path)
    leave_group()


def run_moe_strategy(cases: list[MoeCase]) -> dict:
    """{case: (loss, grads, metrics)}, one spawn per D."""
    results = {}
    for world_size in sorted({c.world_size for c in cases}):
        with tempfile.TemporaryDirectory() as tmp:
            out_path = os.path.join(tmp, "results.pt")
            spawn_ranks(_rank_main, world_size, [c for c in cases if c.world_size == world_size], out_path)
            results.update(torch.load(out_path, weights_only=False))
    return results


def moe_reference(lora: bool = False) -> tuple[float, dict[str, torch.Tensor], dict[str, float]]:
    """(loss, grads, aux values) of one forward/backward of the plain HF model (lora: with peft's adapters) over the
    padded global batch, the expert counts taken from that same forward."""
    lm = copy.deepcopy(moe_lm(lora))
    data = global_batch(torch.float64)
    batch = dict(data.batch)
    attention = batch["attention_mask"]
    with routing(lm) as record:
        output = _policy_output(lm, batch)
    logits = record.router_logits()  # [layers, rows * seq, E]
    output["router_logits"] = logits.reshape(logits.shape[0], *attention.shape, -1).permute(1, 2, 0, 3)
    experts = record.expert_ids(attention.shape)
    meta = {"batch_num_tokens": {}, "global_valid_samples": {}}
    for key in MASK_KEYS[LOSS[0]]:
        mask = batch[key].bool()
        meta["batch_num_tokens"][key] = mask.sum().double()
        meta["global_valid_samples"][key] = (mask.sum(-1) > 0).sum().double()
    meta["moe_expert_counts"] = expert_counts(experts, attention, MOE_MODEL["num_experts"])
    meta["moe_num_tokens"] = attention.sum().double()
    loss, metrics = moe_aux_loss_func(make_loss(*LOSS), AUX_COEF, Z_COEF)(DataProto(batch, meta_info=meta), output)
    loss.backward()
    aux = {name: float(metrics[f"{name}@sum"]) for name in ("moe_load_balancing_loss", "moe_z_loss")}
    return loss.item(), {n: p.grad for n, p in lm.named_parameters() if p.grad is not None}, aux
