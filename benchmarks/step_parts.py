"""roll_lite's two parts of a GRPO step against the bare transformers calls TRL makes, on the same model and
the same batches (CPU).

    python benchmarks/step_parts.py [--model DIR] [--batches 20] [--rounds 3] [--threads 1]

vs_trl.py measures whole runs, TRL's against roll_lite's, each in its own process. This one takes the step
apart, in one process, so that only the code around the model differs:

- **generate**: `HFEngine.generate` (roll_lite's hf engine: left padding, its seeding, the sampled tokens'
  log-probs recorded) against `model.generate` called as TRL's GRPOTrainer calls it (do_sample, temperature 1,
  top_k 0, top_p 1, 8 return sequences, 16 new tokens), on the same prompts, each with a model of its own
  loaded from the same weights;
- **train step**: `FSDP2Strategy.train_step` with the GRPO loss (one rank: the bare model, as a run on one
  CPU rank trains it) against a bare step: the forward, log-softmax of the completion tokens, the clipped
  token-mean loss (TRL's `dapo`), backward, grad-norm clip 1.0 and torch's AdamW (lr 1e-4), on the same
  batches (2 prompts × 8 completions sampled from the model).

Rounds interleave the four, and each part's figure is its median over the rounds of the CPU time per call
(process CPU, so other work on the box moves it less than wall time). `--model`: a HF folder (vs_trl's warm
start: short, realistic completions); default: the demo's model built from configs/grpo.yaml, whose random
completions run to the 16-token limit.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from one_rank import grpo_batches  # noqa: E402


def bare_train_step(model, optimizer, batch) -> None:
    """A train step as a bare loop writes it: the completion tokens' log-probs, the clipped surrogate (ratio 1 on
    policy), the token mean, backward, clip, AdamW."""
    ids, mask = batch["input_ids"], batch["response_mask"][:, 1:].float()
    logits = model(input_ids=ids, attention_mask=batch["attention_mask"]).logits[:, :-1]
    log_probs = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    advantages = batch["advantages"][:, 1:]
    ratio = torch.exp(log_probs - log_probs.detach())
    per_token = -torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)
    loss = (per_token * mask).sum() / mask.sum().clamp(min=1)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()


def bare_generate(model, pair: list[list[int]], pad: int, eos: int) -> None:
    width = max(len(p) for p in pair)
    input_ids = torch.full((len(pair), width), pad, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, prompt in enumerate(pair):  # left-padded, as TRL's processing class pads for generation
        input_ids[i, width - len(prompt) :] = torch.tensor(prompt)
        attention_mask[i, width - len(prompt) :] = 1
    with torch.no_grad():
        model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            num_return_sequences=8,
            max_new_tokens=16,
            pad_token_id=pad,
            eos_token_id=eos,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="a HF folder (default: configs/grpo.yaml's model)")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from roll_lite.pipelines.ppo import PPOPipeline

    from roll_lite.config import load_config
    from roll_lite.data.prompts import prepare_datasets
    from roll_lite.model.modeling import load_causal_lm
    from roll_lite.model.tokenizer import load_tokenizer
    from roll_lite.rollout import HFEngine, SamplingParams
    from roll_lite.strategy import FSDP2Strategy

    overrides = [
        f"data.train_files={REPO / 'data/reverse_digits/train.jsonl'}",
        "data.eval_files=null",
        "sft.steps=0",
        "actor.lr=1e-4",
        "algorithm.track_kl=false",
        *([f"model.pretrained_path={args.model}"] if args.model else []),
    ]
    config = load_config(REPO / "configs/grpo.yaml", overrides)
    tokenizer = load_tokenizer(str(args.model) if args.model else config.model.tokenizer_path)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id

    def model():
        return load_causal_lm(config.model, len(tokenizer), seed=config.seed)

    batches = grpo_batches(config, tokenizer, args.batches)
    prompts = prepare_datasets(config.data, tokenizer).train.prompt_ids[: 2 * args.batches]
    pairs = [prompts[2 * i : 2 * i + 2] for i in range(args.batches)]
    strategy, loss_func = FSDP2Strategy(model(), config.actor), PPOPipeline(config).loss_func
    bare = model()
    optimizer = torch.optim.AdamW(bare.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    engine, generating = HFEngine(model(), pad, eos), model()

    parts = {  # (label, roll_lite's call, the bare call, items)
        "generate": (
            lambda pair: engine.generate(pair, SamplingParams(16, 8)),
            lambda pair: bare_generate(generating, pair, pad, eos),
            pairs,
        ),
        "train step": (
            lambda batch: strategy.train_step(batch, loss_func),
            lambda batch: bare_train_step(bare, optimizer, batch),
            batches,
        ),
    }
    seconds: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for part, (ours, theirs, items) in parts.items():
            for side, call in (("roll_lite", ours), ("bare", theirs)):
                start = time.process_time()
                for item in items:
                    call(item)
                seconds.setdefault((part, side), []).append((time.process_time() - start) / len(items))

    print(
        f"\n{args.batches} calls per part and round, {args.rounds} rounds interleaved, {args.threads} torch "
        f"thread(s), model: {args.model or 'configs/grpo.yaml, built from config'}\n"
    )
    print("| part | roll_lite ms (rounds) | bare transformers ms (rounds) | roll_lite / bare |")
    print("|---|---|---|---|")
    for part in parts:
        ours, theirs = seconds[(part, "roll_lite")], seconds[(part, "bare")]
        rounds = lambda values: " / ".join(f"{1e3 * v:.1f}" for v in values)  # noqa: E731
        print(
            f"| {part} | {1e3 * statistics.median(ours):.1f} ({rounds(ours)}) | "
            f"{1e3 * statistics.median(theirs):.1f} ({rounds(theirs)}) | "
            f"{statistics.median(ours) / statistics.median(theirs):.2f} |"
        )


if __name__ == "__main__":
    main()
