"""Runs the real FSDP2 strategy in D gloo processes and an independent single-process reference.

Used by test_exactness.py (float64, tolerance 1e-10) and benchmarks/exactness.py (float64 and
float32 table). The reference is one forward/backward of the plain HF model over the whole padded
global batch with full logits and log_softmax (policy losses), or the HF decoder's hidden states
times the value head's weights (critic, loss 'value'): no strategy, packing or chunking code involved.
The losses and batches of the cases: loss_cases.py (RL, SFT, critic, distillation) and pair_cases.py.
"""

from __future__ import annotations

import functools
import math
import os
import tempfile
import weakref
from dataclasses import dataclass

import torch
from loss_cases import (
    BUDGET,
    CRITIC_LOSSES,
    MASK_KEYS,
    USER_MASK_KEYS,
    global_batch,
    lora_model,
    make_loss,
    value_head_weights,
)
from pair_cases import (
    PAIR_BUDGET,
    PAIR_LOSSES,
    PAIR_MODE,
    PAIR_ROWS,
    make_pair_loss,
    pair_batch,
    reference_scores,
    score_head_weights,
)
from spawned_ranks import join_group, leave_group, spawn_ranks

from roll_lite.data.pairs import PAIR_MASK_KEYS
from roll_lite.loss import AGG_MODES
from roll_lite.loss.checker import TINY_MODEL, relative_deviation
from roll_lite.model.modeling import build_causal_lm, enable_gradient_checkpointing

DTYPE_NAMES = {torch.float64: "float64", torch.float32: "float32"}


def mask_keys(loss: str) -> list[str]:
    return list(PAIR_MASK_KEYS) if loss in PAIR_LOSSES else {**MASK_KEYS, **USER_MASK_KEYS}[loss]


def loss_for(loss: str, mode: str):
    return make_pair_loss(loss) if loss in PAIR_LOSSES else make_loss(loss, mode)


@dataclass(frozen=True)
class Case:
    loss: str
    mode: str
    world_size: int
    grad_accum_steps: int
    micro_batching: str  # padded | packed | budget
    rows: int = 7  # rows of the global batch: 1 leaves the second rank with an empty share
    lora: bool = False  # LoRA adapters on a frozen base: only they train (lora_model)
    checkpointing: bool = False  # model.gradient_checkpointing: each decoder layer recomputed in backward
    sequence_parallel: int = 1  # S: each of the world_size (D) shares runs on S ranks, 1/S of every sequence each

    @property
    def ranks(self) -> int:
        return self.world_size * self.sequence_parallel

    @property
    def id(self) -> str:
        a = "budget" if self.micro_batching == "budget" else f"A{self.grad_accum_steps}"
        suffix = ("" if self.rows == 7 else f"-{self.rows}row") + ("-lora" if self.lora else "")
        suffix += "-checkpointing" if self.checkpointing else ""
        d = f"D{self.world_size}" + (f"-S{self.sequence_parallel}" if self.sequence_parallel > 1 else "")
        return f"{self.loss}-{self.mode}-{d}-{a}-{self.micro_batching}{suffix}"


def case_model(case: Case, dtype: torch.dtype) -> torch.nn.Module:
    return lora_model(dtype) if case.lora else build_causal_lm(TINY_MODEL, dtype=dtype, seed=0)


def all_cases() -> list[Case]:
    cases = []
    for world_size in (1, 2):
        for loss in MASK_KEYS:
            for mode in ("token-mean",) if loss == "sft" else AGG_MODES:
                for a in (1, 2, 3):
                    for micro_batching in ("padded", "packed"):
                        cases.append(Case(loss, mode, world_size, a, micro_batching))
                cases.append(Case(loss, mode, world_size, 1, "budget"))
    # LoRA: the adapters' gradients, the base frozen (FSDP2 shards both), every agg mode.
    for world_size in (1, 2):
        for loss in ("ppo", "ppo_kl"):
            for mode in AGG_MODES:
                cases += [
                    Case(loss, mode, world_size, a, mb, lora=True) for a in (1, 2, 3) for mb in ("padded", "packed")
                ]
                cases.append(Case(loss, mode, world_size, 1, "budget", lora=True))
    # One row for two ranks: rank 1 only runs placeholder passes.
    for loss in ("ppo_kl", "value"):
        cases += [Case(loss, "seq-mean-token-mean", 2, 2, mb, rows=1) for mb in ("padded", "packed", "budget")]
    # Pair losses (pair_cases.py): pairs kept together on a rank and in a micro-batch.
    for world_size in (1, 2):
        for loss in PAIR_LOSSES:
            cases += [
                Case(loss, PAIR_MODE, world_size, a, mb, rows=PAIR_ROWS)
                for a in (1, 2, 3)
                for mb in ("padded", "packed")
            ]
            cases.append(Case(loss, PAIR_MODE, world_size, 1, "budget", rows=PAIR_ROWS))
    # Activation checkpointing under FSDP2 (and unwrapped on one rank), packed and token-budget.
    for loss in ("ppo_kl", "value"):
        cases += [
            Case(loss, "seq-mean-token-mean", d, a, mb, checkpointing=True)
            for d in (1, 2)
            for a, mb in ((2, "packed"), (1, "budget"))
        ]
    return cases


def case_batch(loss: str, dtype: torch.dtype, rows: int):
    if loss in PAIR_LOSSES:
        return pair_batch(dtype)
    data = global_batch(dtype, rows)
    if loss == "distill_topk":  # a teacher's top 3 next tokens at each position, and its log-probs of them
        generator = torch.Generator().manual_seed(13)
        shape = (*data["input_ids"].shape, 3)
        data.batch["teacher_top_k_ids"] = torch.randint(0, TINY_MODEL["vocab_size"], shape, generator=generator)
        data.batch["teacher_top_k_log_probs"] = -torch.rand(shape, generator=generator, dtype=dtype) * 3 - 0.1
    return data


_shard_rows: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # whole_gradients': {model: rows of each rank}


def whole_gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """{parameter name: its whole gradient}. One rank trains the bare model (plain tensors); FSDP2's
    gradients are DTensor shards, split along dim 0 (Shard(0) on the one-dimensional mesh): every rank's
    shards go out flattened into one tensor, in one all_gather (full_tensor: 28 collectives per case;
    all_gather_object of the shards: ~8 CPU ms per case and rank, pickling), after one of each rank's row
    counts per model; each whole gradient is the ranks' shards in rank order."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Shard

    grads = {n.removeprefix("lm."): p.grad for n, p in model.named_parameters() if p.grad is not None}
    sharded = {n: g for n, g in grads.items() if isinstance(g, DTensor)}
    if not sharded:
        return grads
    assert all(g.placements == (Shard(0),) for g in sharded.values()), {n: g.placements for n, g in sharded.items()}
    local = [g.to_local() for g in sharded.values()]
    world_size = dist.get_world_size()
    if model not in _shard_rows:  # every rank's rows of each parameter: the same at every step
        rows = [torch.zeros(len(local), dtype=torch.long) for _ in range(world_size)]
        dist.all_gather(rows, torch.tensor([t.shape[0] for t in local]))
        _shard_rows[model] = rows
    rows = _shard_rows[model]
    sizes = [[int(r) * math.prod(t.shape[1:]) for r, t in zip(rank_rows, local)] for rank_rows in rows]
    flat = torch.zeros(max(sum(s) for s in sizes), dtype=local[0].dtype)
    flat[: sum(sizes[dist.get_rank()])] = torch.cat([t.reshape(-1) for t in local])
    gathered = [torch.empty_like(flat) for _ in range(world_size)]
    dist.all_gather(gathered, flat)
    pieces = [buffer.split([*rank_sizes, len(flat) - sum(rank_sizes)]) for buffer, rank_sizes in zip(gathered, sizes)]
    for index, (name, grad) in enumerate(sharded.items()):
        whole = torch.cat([rank_pieces[index] for rank_pieces in pieces])
        assert whole.numel() == grad.numel(), (name, whole.numel(), grad.shape)
        grads[name] = whole.view(grad.shape)
    return grads


def _packed(grads: dict[str, torch.Tensor]) -> tuple[tuple, torch.Tensor]:
    # a case's gradients as one tensor and their (name, shape) list: torch.save and load spend their time
    # per tensor (~27 a case), not per byte
    layout = tuple((name, grad.shape) for name, grad in grads.items())
    return layout, torch.cat([grad.reshape(-1) for grad in grads.values()])


def _unpacked(layout: tuple, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    pieces = flat.split([shape.numel() for _, shape in layout])
    return {name: piece.view(shape) for (name, shape), piece in zip(layout, pieces)}


def _rank_main(rank: int, world_size: int, port: int, cases: list[Case], dtype: torch.dtype, out_path: str):
    join_group(rank, world_size, port)
    from roll_lite.strategy import StrategyConfig
    from roll_lite.strategy.micro_batches import split_for_data_parallel

    results, strategies, layouts, batches = {}, {}, {}, {}
    for case in cases:
        if (case.loss, case.rows) not in batches:
            batches[case.loss, case.rows] = case_batch(case.loss, dtype, case.rows)
        data = batches[case.loss, case.rows]
        data = data.slice(0, len(data))  # meta_info of its own; the shares below copy the rows
        budget = PAIR_BUDGET if case.loss in PAIR_LOSSES else BUDGET
        config = StrategyConfig(
            grad_accum_steps=case.grad_accum_steps,
            use_packing=case.micro_batching != "padded",
            max_tokens_per_micro_batch=budget if case.micro_batching == "budget" else None,
            lr=0.0,
            max_grad_norm=None,
            param_dtype=DTYPE_NAMES[dtype],
            logprob_chunk_size=8,
            sequence_parallel=case.sequence_parallel,
        )
        critic = case.loss in CRITIC_LOSSES
        head = "value" if critic else "score" if case.loss == "bt" else "log_probs"
        # lr 0 leaves the weights as built (AdamW adds -0.0 and decays by 1 - 0): the cases that share a
        # config, a head and a model share one strategy, each case its own train_step from the same weights.
        key = (repr(config), head, case.lora, case.checkpointing)
        if key not in strategies:
            strategies[key] = _case_strategy(case, config, head, dtype)
        strategy = strategies[key]
        data.meta_info["loss_mask_keys"] = mask_keys(case.loss)
        # the S ranks of data-parallel rank rank // S share its rows (roll_lite/strategy/sequence_parallel.py)
        assert case.ranks == world_size, (case.id, world_size)
        dp_rank = rank // case.sequence_parallel
        share = split_for_data_parallel(data, case.world_size, balance_tokens=config.use_packing)[dp_rank]
        metrics = strategy.train_step(share, loss_for(case.loss, case.mode))
        # The critic never uses the LM head: its weight gets no gradient (deviations() checks the names).
        layout, flat = _packed(whole_gradients(strategy.model))
        results[case] = (metrics["loss"], layouts.setdefault(layout, layout), flat, metrics["num_micro_batches"])
    if rank == 0:
        torch.save(results, out_path)
    leave_group()


def _case_strategy(case: Case, config, head: str, dtype: torch.dtype):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from roll_lite.strategy import FSDP2Strategy

    lm = case_model(case, dtype)
    if case.checkpointing:
        enable_gradient_checkpointing(lm)
    strategy = FSDP2Strategy(lm, config, head=head)
    if head != "log_probs":
        options = StateDictOptions(full_state_dict=True, strict=False)
        weights = value_head_weights(dtype) if head == "value" else score_head_weights(dtype)
        set_model_state_dict(strategy.model, weights, options=options)
    return strategy


def run_strategy(cases: list[Case], dtype: torch.dtype, start_method: str = "forkserver") -> dict:
    """{case: (loss, grads, micro-batches per rank)} from real FSDP2 runs, grouped by their count of ranks
    (D·S processes); start_method: spawned_ranks.spawn_ranks's."""
    results = {}
    for world_size in sorted({c.ranks for c in cases}):
        group = [c for c in cases if c.ranks == world_size]
        with tempfile.TemporaryDirectory() as tmp:
            out_path = os.path.join(tmp, "results.pt")
            spawn_ranks(_rank_main, world_size, group, dtype, out_path, start_method=start_method)
            packed = torch.load(out_path, weights_only=False)
        for case, (loss, layout, flat, micro_batches) in packed.items():
            results[case] = (loss, _unpacked(layout, flat), micro_batches)
    return results


def _token_aligned(next_token_values: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    # [rows, seq - 1]: column j belongs to token j+1. Token 0 and padding get 0.
    valid = attention_mask.bool()
    valid[:, 0] = False
    pad = torch.zeros(len(next_token_values), 1, dtype=torch.float64)
    return torch.where(valid, torch.cat([pad, next_token_values], 1), 0.0)


def _policy_output(lm, batch) -> dict:
    logits = lm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
    log_softmax = torch.log_softmax(logits, dim=-1)
    next_log_probs = log_softmax[:, :-1].gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    next_entropy = -(log_softmax.exp() * log_softmax).sum(-1)[:, :-1]
    output = {
        "log_probs": _token_aligned(next_log_probs, batch["attention_mask"]),
        "entropy": _token_aligned(next_entropy, batch["attention_mask"]),
    }
    if "teacher_top_k_ids" in batch:  # token t's ids, from the distribution at position t - 1
        gathered = log_softmax[:, :-1].gather(-1, batch["teacher_top_k_ids"][:, 1:])
        valid = batch["attention_mask"].bool().clone()
        valid[:, 0] = False
        padded = torch.cat([torch.zeros_like(gathered[:, :1]), gathered], dim=1)
        output["top_k_log_probs"] = torch.where(valid[..., None], padded, 0.0)
    return output


def _critic_output(lm, batch, head: dict) -> dict:
    # The hidden state at position j values the state in which token j+1 is generated.
    hidden = lm.model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
    ).last_hidden_state
    next_values = torch.einsum("bth,h->bt", hidden[:, :-1], head["value_head.weight"][0]) + head["value_head.bias"][0]
    return {"values": _token_aligned(next_values, batch["attention_mask"])}


def reference(loss_name: str, mode: str, dtype: torch.dtype, rows: int = 7, lora: bool = False):
    """(loss, grads) of one float64 forward/backward of the plain HF model (with LoRA: peft's) over
    the global batch."""
    lm = _reference_model(dtype, lora)
    for parameter in lm.parameters():  # the gradients of this backward alone (the last one's stay the caller's)
        parameter.grad = None
    data = case_batch(loss_name, dtype, rows)
    batch = {k: (v.double() if v.is_floating_point() else v) for k, v in data.batch.items()}
    head = {}
    if loss_name in CRITIC_LOSSES:
        head = {n: w.double().requires_grad_() for n, w in value_head_weights(dtype).items()}
        output = _critic_output(lm, batch, head)
    elif loss_name == "bt":
        head = {n: w.double().requires_grad_() for n, w in score_head_weights(dtype).items()}
        output = reference_scores(lm, batch, head)
    else:
        output = _policy_output(lm, batch)
    meta = {"batch_num_tokens": {}, "global_valid_samples": {}}
    for key in mask_keys(loss_name):
        mask = batch[key].bool()
        meta["batch_num_tokens"][key] = mask.sum().double()
        meta["global_valid_samples"][key] = (mask.sum(-1) > 0).sum().double()
    from roll_lite.data import DataProto

    loss, _ = loss_for(loss_name, mode)(DataProto(batch, meta_info=meta), output)
    loss.backward()
    params = dict(lm.named_parameters())
    if loss_name in CRITIC_LOSSES or loss_name == "bt":
        params = {n: p for n, p in params.items() if not n.startswith("lm_head.")} | head
    return loss.item(), {n: p.grad for n, p in params.items() if p.requires_grad}


@functools.cache
def _reference_model(dtype: torch.dtype, lora: bool) -> torch.nn.Module:
    """The model every reference of this dtype computes with, in float64: no step changes its weights."""
    return (lora_model(dtype) if lora else build_causal_lm(TINY_MODEL, dtype=dtype, seed=0)).double()


def deviations(result, ref) -> tuple[float, float]:
    """(loss relative error, worst per-parameter gradient relative error)."""
    (loss, grads, _), (ref_loss, ref_grads) = result, ref
    assert set(grads) == set(ref_grads), set(grads) ^ set(ref_grads)
    return relative_deviation(loss, ref_loss), max(
        relative_deviation(grads[n].double(), ref_grads[n]) for n in ref_grads
    )


def case_deviations(case: Case, strategy_results: dict, references: dict) -> tuple[float, float]:
    """deviations() of `case`'s strategy run from one forward/backward over the global batch, float64; the
    reference is computed once per (loss, mode, rows, lora) and kept in `references`."""
    key = (case.loss, case.mode, case.rows, case.lora)
    if key not in references:
        references[key] = reference(case.loss, case.mode, torch.float64, case.rows, case.lora)
    return deviations(strategy_results[case], references[key])


OPTIMIZER_CASE = ("ppo_kl", "token-mean")
OPTIMIZER_SETTINGS = dict(lr=1e-2, max_grad_norm=0.05, weight_decay=0.1)


def optimizer_step_on_this_rank(rank: int, world_size: int) -> tuple[dict, dict]:
    """In a spawned rank of a joined group: (metrics, full state dict) after one clipped AdamW step of
    OPTIMIZER_CASE on this rank's share of the global batch."""
    from roll_lite.strategy import FSDP2Strategy, StrategyConfig
    from roll_lite.strategy.micro_batches import split_for_data_parallel

    data = global_batch(torch.float64)
    data.meta_info["loss_mask_keys"] = MASK_KEYS[OPTIMIZER_CASE[0]]
    config = StrategyConfig(grad_accum_steps=2, use_packing=True, param_dtype="float64", **OPTIMIZER_SETTINGS)
    strategy = FSDP2Strategy(build_causal_lm(TINY_MODEL, dtype=torch.float64, seed=0), config)
    share = split_for_data_parallel(data, world_size, balance_tokens=True)[rank]
    metrics = strategy.train_step(share, make_loss(*OPTIMIZER_CASE))
    return metrics, strategy.full_state_dict()
