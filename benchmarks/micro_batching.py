"""How much of the computed attention/MLP work is useful, per micro-batching option:

    python benchmarks/micro_batching.py            # the token table (no model; seconds)
    python benchmarks/micro_batching.py --time     # also a padded vs trimmed vs packed train step on CPU

Lengths are long-tailed like RL rollouts: prompts of 16-128 tokens, responses log-normal with 10 %
cut at the cap. The grouping is the strategy's own (split_for_data_parallel, split_micro_batches).
"useful" = real tokens / tokens computed (a padded micro-batch computes rows x its width; a packed
one only its tokens). "imbalance" = the largest D-rank share's real tokens / the mean share's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from roll_lite.data import DataProto
from roll_lite.loss.checker import random_rl_batch
from roll_lite.model.packing import row_lengths
from roll_lite.strategy.config import StrategyConfig
from roll_lite.strategy.micro_batches import split_for_data_parallel, split_micro_batches


def rollout_like_batch(num_rows: int, cap: int, seed: int = 0) -> DataProto:
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(16, 129, (num_rows,), generator=gen)
    responses = torch.exp(torch.randn(num_rows, generator=gen) * 0.9 + torch.log(torch.tensor(cap / 6.0))).long()
    responses[torch.randperm(num_rows, generator=gen)[: num_rows // 10]] = cap
    lengths = prompts + responses.clamp(1, cap)
    width = int(lengths.max())
    attention_mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    response_mask = attention_mask * (torch.arange(width)[None, :] >= prompts[:, None]).long()
    input_ids = torch.randint(1, 500, (num_rows, width), generator=gen) * attention_mask
    return DataProto(
        {"input_ids": input_ids, "attention_mask": attention_mask, "response_mask": response_mask},
        meta_info={"loss_mask_keys": ["response_mask"]},
    )


OPTIONS = {
    "padded, untrimmed": dict(trim_padding=False),
    "padded, trimmed": dict(trim_padding=True),
    "packed": dict(use_packing=True),
}


def token_table(data: DataProto, cap: int) -> None:
    real = int(data["attention_mask"].sum())
    print(
        f"## useful-token fraction, {len(data)} rows, {real} real tokens, widest row {data['input_ids'].shape[1]} "
        f"(cap {cap} on 10 % of responses)\n"
    )
    print("| option | D | A | useful | D-rank imbalance |")
    print("|---|---|---|---|---|")
    for label, options in OPTIONS.items():
        for world_size in (1, 2, 4):
            for accum in (1, 4, 8):
                config = StrategyConfig(grad_accum_steps=accum, **options)
                shares = split_for_data_parallel(data, world_size, balance_tokens=config.use_packing)
                computed, share_tokens = 0, []
                for share in shares:
                    share_tokens.append(int(share["attention_mask"].sum()))
                    for micro_batch in split_micro_batches(share, config):
                        lengths = row_lengths(micro_batch["attention_mask"])
                        computed += (
                            sum(lengths) if config.use_packing else len(lengths) * micro_batch["input_ids"].shape[1]
                        )
                imbalance = max(share_tokens) / statistics.mean(share_tokens)
                print(f"| {label} | {world_size} | {accum} | {real / computed:.3f} | {imbalance:.4f} |")
    print()


def time_steps(steps: int) -> None:
    from roll_lite.loss import ppo_policy_loss_func
    from roll_lite.model.modeling import build_causal_lm
    from roll_lite.strategy import FSDP2Strategy

    model_config = dict(
        model_type="qwen2",
        vocab_size=512,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    data = rollout_like_batch(32, cap=256, seed=1)
    extra = random_rl_batch(num_rows=32, seq_len=data["input_ids"].shape[1], seed=2, dtype=torch.float32)
    for name in ("old_log_probs", "advantages"):
        data.batch[name] = extra[name]
    real = int(data["attention_mask"].sum())
    loss_func = ppo_policy_loss_func("token-mean")
    rows, losses = [], {}
    for label, options in OPTIONS.items():
        config = StrategyConfig(grad_accum_steps=4, lr=0.0, **options)
        strategy = FSDP2Strategy(build_causal_lm(model_config, seed=0), config)
        times = []
        for _ in range(steps + 1):
            start = time.perf_counter()
            metrics = strategy.train_step(data, loss_func)
            times.append(time.perf_counter() - start)
        losses[label] = metrics["loss"]
        rows.append((label, statistics.median(times[1:])))
    base = rows[0][1]
    print(
        f"## CPU train step, Qwen2 {sum(p.numel() for p in build_causal_lm(model_config).parameters()) / 1e6:.1f} M "
        f"params, 32 rows, {real} real tokens (widest {data['input_ids'].shape[1]}), A=4, median of {steps}\n"
    )
    print("| option | s/step | real tokens/s | speed-up vs untrimmed | loss |")
    print("|---|---|---|---|---|")
    for label, seconds in rows:
        print(f"| {label} | {seconds:.3f} | {real / seconds:,.0f} | {base / seconds:.2f}x | {losses[label]:.9f} |")
    print()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time", action="store_true", help="also time a train step per option on CPU")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    cap = 1024
    token_table(rollout_like_batch(256, cap), cap)
    if args.time:
        torch.set_num_threads(2)
        time_steps(args.steps)


if __name__ == "__main__":
    main()
