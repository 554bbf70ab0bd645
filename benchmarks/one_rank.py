"""One actor rank: the bare model against a one-shard FSDP2 wrap, on vs_trl's GRPO train step (CPU).

    python benchmarks/one_rank.py [--batches 30] [--rounds 3] [--threads 1]

With one rank and nothing to cast, FSDP2Strategy trains the bare model (FSDP2 would cut every tensor
into a single shard and run its hooks around every layer). This times both on the same batches,
interleaved: the demo's ~1 M-parameter Qwen2 (configs/grpo.yaml, built from config), 2 prompts × 8
completions of ≤ 16 tokens sampled from it, the built-in GRPO loss. It also checks that both end with
the same weights, bit for bit.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def grpo_batches(config, tokenizer, count: int) -> list:
    from roll_lite.data.prompts import prepare_datasets
    from roll_lite.data.sequences import build_sequence_batch
    from roll_lite.model.modeling import load_causal_lm
    from roll_lite.rollout import HFEngine, SamplingParams

    prompts = prepare_datasets(config.data, tokenizer).train.prompt_ids[: 2 * count]
    engine = HFEngine(
        load_causal_lm(config.model, len(tokenizer), seed=config.seed), tokenizer.pad_token_id, tokenizer.eos_token_id
    )
    batches = []
    for i in range(count):
        pair = prompts[2 * i : 2 * i + 2]
        generated = engine.generate(pair, SamplingParams(16, 8))
        batch = build_sequence_batch(
            [p for p in pair for _ in range(8)], generated.token_ids, tokenizer.pad_token_id, generated.log_probs
        )
        batch.batch["advantages"] = (
            torch.randn(len(batch), 1, generator=torch.Generator().manual_seed(i)) * batch["response_mask"]
        )
        batch.meta_info.update(loss_mask_keys=["response_mask"], on_policy=True)
        batches.append(batch)
    return batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from roll_lite.pipelines.ppo import PPOPipeline

    from roll_lite.config import load_config
    from roll_lite.model.modeling import load_causal_lm
    from roll_lite.model.tokenizer import load_tokenizer
    from roll_lite.strategy import FSDP2Strategy

    config = load_config(
        REPO / "configs/grpo.yaml",
        [
            f"data.train_files={REPO / 'data/reverse_digits/train.jsonl'}",
            "data.eval_files=null",
            "sft.steps=0",
            "actor.lr=1e-4",
            "algorithm.track_kl=false",
        ],
    )
    tokenizer = load_tokenizer(config.model.tokenizer_path)
    batches = grpo_batches(config, tokenizer, args.batches)
    loss_func = PPOPipeline(config).loss_func
    strategies = {
        label: FSDP2Strategy(
            load_causal_lm(config.model, len(tokenizer), seed=config.seed),
            config.actor,
            shard_single_rank=label == "FSDP2, one shard",
        )
        for label in ("bare model", "FSDP2, one shard")
    }
    seconds = {label: [] for label in strategies}
    for _ in range(args.rounds):
        for label, strategy in strategies.items():
            start = time.perf_counter()
            for batch in batches:
                strategy.train_step(batch, loss_func)
            seconds[label].append((time.perf_counter() - start) / len(batches))
    bare, wrapped = (strategies[label].full_state_dict() for label in strategies)
    same = all(torch.equal(bare[name], wrapped[name]) for name in bare)

    print(
        f"\n{args.batches} GRPO train steps per round (2 prompts × 8 completions), {args.rounds} rounds interleaved, "
        f"{args.threads} torch thread(s)\n"
    )
    print("| strategy | s/step per round | median | ÷ bare |")
    print("|---|---|---|---|")
    base = statistics.median(seconds["bare model"])
    for label, values in seconds.items():
        print(
            f"| {label} | {' / '.join(f'{v:.4f}' for v in values)} | {statistics.median(values):.4f} | "
            f"{statistics.median(values) / base:.2f} |"
        )
    print(f"\nsame weights after {args.rounds * args.batches} steps, bit for bit: {same}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
