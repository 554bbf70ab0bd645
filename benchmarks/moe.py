"""An MoE policy against a dense one on CPU (docs/moe.md): the training step of a tiny Qwen3-MoE against a dense
Qwen3 with as many active parameters, and the engine / trainer log-prob gap with and without router replay.

    python benchmarks/moe.py [--rounds 3] [--rows 16] [--new-tokens 24] [--dtypes float32,bfloat16] [--threads 2]

Models, random init (seed 0), the built-in character tokenizer's vocabulary: dense is Qwen3 with roll_lite's
ModelConfig defaults (hidden 128, 4 layers, MLP width 512); moe is Qwen3-MoE with the same attention and 8 experts
of width 256, 2 per token: each token's MLP work is the dense model's (2 × 256 = 512), with 4× its MLP parameters.

1. The step: FSDP2Strategy.train_step (one rank, padded, the PPO clipped loss, token-mean) on the same --rows rows
   of 16 prompt + --new-tokens response tokens, for dense, moe, moe with the load-balancing and z losses
   (coefficients 0.01 / 0.001: the strategy first counts the step's experts in a no-grad forward,
   roll_lite/strategy/moe_stats.py) and moe with router replay. The arms alternate within each round (--rounds of
   --steps steps each, after a warm-up step); reported: the median step and its ratio to the dense step.
2. The gap: the hf engine samples --rows rows (temperature 1) from random prompts, recording each token's experts
   (actor.router_replay's recorder); the trainer scores them in one padded forward (the strategy's
   forward_micro_batch), routing on its own or replaying the recorded experts, with the engine and the trainer in
   the dtypes of each --dtypes pair (bfloat16/float32: a bfloat16 engine, a float32 trainer, as on GPUs). Over the response
   tokens: |log π_engine - log π_trainer| median, p99 and max, and for the moe model the share of (token, layer)
   routings the trainer's routers choose differently from the engine's.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import time

import torch

ARMS = ("dense", "moe", "moe + aux losses", "moe + replay")


def model_config(kind: str):
    from roll_lite.config.schema import ModelConfig
    from roll_lite.model.modeling import causal_lm_config
    from roll_lite.model.tokenizer import build_char_tokenizer

    settings = dict(model_type="qwen3")
    if kind == "moe":
        settings = dict(model_type="qwen3_moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256)
    return causal_lm_config(
        dataclasses.replace(ModelConfig(max_position_embeddings=128), **settings), len(build_char_tokenizer())
    )


def step_batch(rows: int, prompt: int, response: int, vocab: int):
    from roll_lite.data import DataProto

    generator = torch.Generator().manual_seed(1)
    width = prompt + response
    ids = torch.randint(4, vocab, (rows, width), generator=generator)
    mask = torch.ones(rows, width, dtype=torch.long)
    response_mask = torch.zeros(rows, width, dtype=torch.long)
    response_mask[:, prompt:] = 1
    batch = {
        "input_ids": ids,
        "attention_mask": mask,
        "response_mask": response_mask,
        "old_log_probs": -torch.rand(rows, width, generator=generator) * 3,
        "advantages": torch.randn(rows, width, generator=generator),
    }
    return DataProto(batch, meta_info={"loss_mask_keys": ["response_mask"], "temperature": 1.0})


def recorded_experts(model, data) -> torch.Tensor:
    """The model's own routing of the batch's tokens [rows, seq, layers, k]: what the engine would have recorded."""
    from roll_lite.model.moe import routing

    with torch.no_grad(), routing(model, keep_logits=False) as record:
        model(input_ids=data["input_ids"], attention_mask=data["attention_mask"])
    return record.expert_ids(data["input_ids"].shape).to(torch.int16)


def strategies(args):
    from roll_lite.loss import ppo_policy_loss_func
    from roll_lite.loss.aux import moe_aux_loss_func
    from roll_lite.model.modeling import build_causal_lm
    from roll_lite.strategy import FSDP2Strategy, StrategyConfig

    loss = ppo_policy_loss_func("token-mean")
    arms = {}
    for arm in ARMS:
        kind = "dense" if arm == "dense" else "moe"
        options = dict(lr=1e-4)
        if arm == "moe + aux losses":
            options.update(moe_aux_loss_coef=0.01, moe_z_loss_coef=0.001)
        if arm == "moe + replay":
            options.update(router_replay="rollout")
        model = build_causal_lm(model_config(kind), seed=0)
        data = step_batch(args.rows, 16, args.new_tokens, model.config.vocab_size)
        if arm == "moe + replay":
            data.batch["routed_experts"] = recorded_experts(model, data)
        arm_loss = moe_aux_loss_func(loss, 0.01, 0.001) if arm == "moe + aux losses" else loss
        if arm == "moe + aux losses":
            data.meta_info["moe_aux_losses"] = True
        arms[arm] = (FSDP2Strategy(model, StrategyConfig(**options)), data, arm_loss)
    return arms


def step_times(args) -> dict[str, list[float]]:
    arms = strategies(args)
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    for strategy, data, loss in arms.values():
        strategy.train_step(copy.copy(data), loss)  # warm-up
    for _ in range(args.rounds):
        for arm, (strategy, data, loss) in arms.items():
            for _ in range(args.steps):
                start = time.perf_counter()
                strategy.train_step(copy.copy(data), loss)
                times[arm].append(time.perf_counter() - start)
    return times


def padded(sequences: list[list[int]], routed: list[torch.Tensor] | None):
    from roll_lite.data import DataProto

    width = max(map(len, sequences))
    ids, mask = (
        torch.zeros(len(sequences), width, dtype=torch.long),
        torch.zeros(len(sequences), width, dtype=torch.long),
    )
    for i, sequence in enumerate(sequences):
        ids[i, : len(sequence)], mask[i, : len(sequence)] = torch.tensor(sequence), 1
    data = DataProto({"input_ids": ids, "attention_mask": mask}, meta_info={"temperature": 1.0})
    if routed is not None:
        experts = torch.full((len(sequences), width, *routed[0].shape[1:]), -1, dtype=torch.int16)
        for i, row in enumerate(routed):
            experts[i, : len(row)] = row
        data.batch["routed_experts"] = experts
    return data


def gaps(kind: str, engine_dtype: str, trainer_dtype: str, args) -> list[dict]:
    from roll_lite.model.modeling import CausalLMWithLogProbs, build_causal_lm
    from roll_lite.model.moe import GenerationRouting, Routing, routing, routing_drift
    from roll_lite.rollout import SamplingParams
    from roll_lite.rollout.hf import HFEngine
    from roll_lite.strategy.config import StrategyConfig
    from roll_lite.strategy.micro_batches import forward_micro_batch

    config = model_config(kind)
    model = build_causal_lm(config, seed=0)  # float32, then each side's copy in its own dtype
    actor = CausalLMWithLogProbs(copy.deepcopy(model).to(getattr(torch, trainer_dtype))).eval()
    model = model.to(getattr(torch, engine_dtype))
    eos = config.vocab_size  # outside the vocabulary: every row runs to --new-tokens
    engine = HFEngine(model, 0, eos, seed=0, record_experts=GenerationRouting if kind == "moe" else None)
    generator = torch.Generator().manual_seed(2)
    prompts = [torch.randint(4, config.vocab_size, (16,), generator=generator).tolist() for _ in range(args.rows)]
    completions = engine.generate(prompts, SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0))
    sequences = [prompt + tokens for prompt, tokens in zip(prompts, completions.token_ids)]
    theirs = torch.tensor([value for row in completions.log_probs for value in row], dtype=torch.float64)
    rows = []
    for replay in (False, True) if kind == "moe" else (False,):
        data = padded(sequences, completions.routed_experts if kind == "moe" else None)
        with torch.no_grad():
            if kind == "moe":
                forced = data["routed_experts"] if replay else None
                with routing(actor, replay=forced, keep_logits=False) as record:
                    log_probs = forward_micro_batch(actor, data, StrategyConfig(), False)["log_probs"]
                shape = data["input_ids"].shape
                columns = routing_drift(
                    record.expert_ids(shape),
                    Routing(experts=record.own).expert_ids(shape),
                    data["routed_experts"],
                    data["attention_mask"],
                )
                drift = (columns["routing_own_differs"].sum() / columns["routing_known"].sum()).item()
            else:
                log_probs = forward_micro_batch(actor, data, StrategyConfig(), False)["log_probs"]
                drift = None
        ours = torch.cat([log_probs[i, len(p) : len(s)] for i, (p, s) in enumerate(zip(prompts, sequences))]).double()
        gap = (theirs - ours).abs()
        rows.append(
            dict(
                model=kind,
                dtypes=f"{engine_dtype} / {trainer_dtype}",
                replay="rollout" if replay else "off",
                tokens=len(gap),
                median=gap.median().item(),
                p99=torch.quantile(gap, 0.99).item(),
                max=gap.max().item(),
                drift=drift,
            )
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="steps per arm in each round")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument(
        "--dtypes", default="float32/float32,bfloat16/bfloat16,bfloat16/float32", help="engine/trainer pairs"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-steps", action="store_true", help="only the log-prob gap")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not args.skip_steps:
        times = step_times(args)
        dense = statistics.median(times["dense"])
        print(f"## Training step, {args.rows} rows × {16 + args.new_tokens} tokens, median of {len(times['dense'])}\n")
        print("| arm | s/step | vs dense |")
        print("|---|---:|---:|")
        for arm, values in times.items():
            print(f"| {arm} | {statistics.median(values):.3f} | {statistics.median(values) / dense:.2f}× |")
        print()
    print(f"## Engine / trainer log-prob gap, {args.rows} rows × {args.new_tokens} sampled tokens\n")
    print(
        "| model | engine / trainer dtype | router replay | tokens | |Δ| median | |Δ| p99 | |Δ| max | routings the trainer's routers choose otherwise |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for pair in args.dtypes.split(","):
        engine_dtype, trainer_dtype = pair.split("/")
        for kind in ("dense", "moe"):
            for r in gaps(kind, engine_dtype, trainer_dtype, args):
                drift = "—" if r["drift"] is None else f"{r['drift']:.2%}"
                print(
                    f"| {r['model']} | {r['dtypes']} | {r['replay']} | {r['tokens']} | {r['median']:.2e} "
                    f"| {r['p99']:.2e} | {r['max']:.2e} | {drift} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
