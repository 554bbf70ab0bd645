"""The engine / actor log-prob mismatch on CPU: the hf engine, its exact mode (rollout.exact) and the vllm
engine against the actor's own log-probs, in float32 and bfloat16, across batch sizes.

    python benchmarks/mismatch.py [--engines hf,exact,vllm] [--dtypes float32,bfloat16] [--batches 1,8,32]
                                  [--new-tokens 16] [--prompt-tokens 8] [--threads 1] [--model demo] [--repeats 1]
                                  [--smoke]

Model (--model): demo is configs/grpo.yaml's (roll_lite's ModelConfig defaults, the built-in character
tokenizer's vocabulary), 48m benchmarks/engines.py's; random init (seed 0), in the dtype of the row: the engine's weights and the actor's
compute dtype are the same. Each batch size B is one generate call of B random prompts (one sample
each, temperature 1, no top-k / top-p, every row runs to --new-tokens: the EOS is outside the
vocabulary). The actor scores the finished rows as the strategy does (forward_micro_batch, one padded
micro-batch; with the batch-invariant kernels for the exact mode, as rollout.exact sets them). Per
row of the table, over the response tokens: |Δ| = |log π_engine - log π_actor| median, p99 and max, and
the share of tokens whose ratio π_actor / π_engine is outside [0.9, 1.1] (rollout.mismatch_band's
default); `gen s`: the generate call's seconds; `actor s`: the actor's forward and backward over the
rows (a training pass), each the fastest of --repeats calls. Each dtype runs in a process of its own (`--child`): one vLLM engine per process.
`--smoke`: the hf engine and the exact mode, float32, batches 1 and 4, 4 new tokens, in this process.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))  # engines.py beside it, also when the suite loads this file
from engines import MODELS, VOCAB_48M  # noqa: E402  (the 48m model: hidden 512, 8 layers, 8 / 4 heads)

RESULT = "RESULT "
ENGINES = ("hf", "exact", "vllm")


def model_config(name: str):
    from roll_lite.config.schema import ModelConfig
    from roll_lite.model.modeling import causal_lm_config
    from roll_lite.model.tokenizer import build_char_tokenizer

    if name == "demo":
        return causal_lm_config(ModelConfig(), len(build_char_tokenizer()))
    return causal_lm_config(dataclasses.replace(ModelConfig(), **MODELS["48m"]), VOCAB_48M)


def start_vllm(config, dtype: str, model):
    from roll_lite.rollout.vllm_engine import VLLMEngine
    from roll_lite.rollout.vllm_requests import vllm_logprobs_mode
    from roll_lite.rollout.vllm_start import start_llm
    from roll_lite.rollout.vllm_weights import checkpoint_names

    llm, sampling_params_class = start_llm(
        config,
        dtype=dtype,
        seed=0,
        logprobs_mode=vllm_logprobs_mode(1.0, 1.0, 0),
        tensor_parallel_size=1,
        gpu_memory_utilization=0.5,
        sleep_mode=False,
        cpu_kv_cache_gib=1,
        enforce_eager=True,
    )

    def no_stop(**kwargs):  # vLLM refuses stop token ids outside the vocabulary
        return sampling_params_class(**{**kwargs, "stop_token_ids": [], "ignore_eos": True})

    engine = VLLMEngine(
        llm,
        no_stop,
        config.vocab_size,
        tie_word_embeddings=bool(config.tie_word_embeddings),
        seed=0,
        checkpoint_names=checkpoint_names(config),
    )
    engine.update_weights(model.state_dict())
    return engine


def actor_pass(actor, prompts, completions, batch_invariant: bool) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(actor log-probs, engine log-probs) of the response tokens, flat, and the training pass's seconds."""
    from roll_lite.data import DataProto
    from roll_lite.strategy.config import StrategyConfig
    from roll_lite.strategy.micro_batches import forward_micro_batch

    sequences = [prompt + tokens for prompt, tokens in zip(prompts, completions.token_ids)]
    width = max(map(len, sequences))
    input_ids, attention_mask = torch.zeros(len(sequences), width, dtype=torch.long), torch.zeros(len(sequences), width)
    for i, sequence in enumerate(sequences):
        input_ids[i, : len(sequence)], attention_mask[i, : len(sequence)] = torch.tensor(sequence), 1
    data = DataProto({"input_ids": input_ids, "attention_mask": attention_mask.long()}, meta_info={"temperature": 1.0})
    start = time.perf_counter()
    log_probs = forward_micro_batch(actor, data, StrategyConfig(batch_invariant=batch_invariant), False)["log_probs"]
    log_probs.sum().backward()
    seconds = time.perf_counter() - start
    actor.zero_grad(set_to_none=True)
    ours = torch.cat([log_probs[i, len(p) : len(s)].detach() for i, (p, s) in enumerate(zip(prompts, sequences))])
    theirs = torch.tensor([value for row in completions.log_probs for value in row])
    return ours.double(), theirs.double(), seconds


def measure(dtype_name: str, args) -> list[dict]:
    from roll_lite.model.exact_decoding import exact_generate
    from roll_lite.model.modeling import CausalLMWithLogProbs, build_causal_lm
    from roll_lite.rollout import SamplingParams
    from roll_lite.rollout.hf import HFEngine

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, dtype_name)
    config = model_config(args.model)
    model = build_causal_lm(config, dtype=dtype, seed=0)
    actor = CausalLMWithLogProbs(copy.deepcopy(model)).train()
    eos = config.vocab_size  # no row ends early
    engines = {}
    for name in args.engines:
        if name == "vllm":
            engines[name] = start_vllm(config, dtype_name, model)
        else:
            decode = exact_generate if name == "exact" else None
            engines[name] = HFEngine(copy.deepcopy(model), 0, eos, seed=0, decode=decode)
    rng = random.Random(0)
    params = SamplingParams(max_new_tokens=args.new_tokens, num_samples=1, temperature=1.0)
    rows = []
    for name, engine in engines.items():
        engine.generate([[5] * args.prompt_tokens], params)  # warm-up
        for batch in args.batches:
            prompts = [[rng.randrange(4, config.vocab_size) for _ in range(args.prompt_tokens)] for _ in range(batch)]
            generate_s, actor_s = float("inf"), float("inf")
            for _ in range(args.repeats):  # the fastest of the repeats; the statistics of the last
                start = time.perf_counter()
                completions = engine.generate(prompts, params)
                generate_s = min(generate_s, time.perf_counter() - start)
                ours, theirs, seconds = actor_pass(actor, prompts, completions, batch_invariant=name == "exact")
                actor_s = min(actor_s, seconds)
            gaps = (theirs - ours).abs()
            ratio = torch.exp(ours - theirs)
            rows.append(
                dict(
                    engine=name,
                    dtype=dtype_name,
                    batch=batch,
                    tokens=len(gaps),
                    median=gaps.median().item(),
                    p99=torch.quantile(gaps, 0.99).item(),
                    max=gaps.max().item(),
                    out_of_band=((ratio < 0.9) | (ratio > 1.1)).double().mean().item(),
                    generate_s=generate_s,
                    actor_s=actor_s,
                )
            )
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| engine | dtype | batch | tokens | |Δ| median | |Δ| p99 | |Δ| max | ratio out of [0.9, 1.1] | gen s | actor s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['engine']} | {r['dtype']} | {r['batch']} | {r['tokens']} | {r['median']:.2e} | {r['p99']:.2e} "
            f"| {r['max']:.2e} | {r['out_of_band']:.2%} | {r['generate_s']:.3f} | {r['actor_s']:.3f} |"
        )
    return "\n".join(lines)


def child(dtype: str, args) -> list[dict]:
    command = [sys.executable, __file__, "--child", dtype, *forwarded(args)]
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    lines = [line for line in run.stdout.splitlines() if line.startswith(RESULT)]
    if run.returncode or not lines:
        raise RuntimeError(f"the {dtype} child failed (exit {run.returncode}):\n{run.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT) :])


def forwarded(args) -> list[str]:
    return [
        f"--engines={','.join(args.engines)}",
        f"--batches={','.join(map(str, args.batches))}",
        f"--new-tokens={args.new_tokens}",
        f"--prompt-tokens={args.prompt_tokens}",
        f"--threads={args.threads}",
        f"--model={args.model}",
        f"--repeats={args.repeats}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="hf,exact,vllm")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", choices=("demo", "48m"), default="demo")
    parser.add_argument("--repeats", type=int, default=1, help="time the fastest of this many calls")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.engines, args.dtypes, args.batches, args.new_tokens = "hf,exact", "float32", "1,4", 4
    args.engines = args.engines.split(",")
    unknown = [name for name in args.engines if name not in ENGINES]
    if unknown:
        parser.error(f"--engines: {unknown} are not among {', '.join(ENGINES)}")
    args.batches = [int(b) for b in str(args.batches).split(",")]
    if args.child:
        print(RESULT + json.dumps(measure(args.child, args)))
        return 0
    dtypes = args.dtypes.split(",")
    in_process = args.smoke or "vllm" not in args.engines and len(dtypes) == 1
    rows = [row for dtype in dtypes for row in (measure(dtype, args) if in_process else child(dtype, args))]
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
