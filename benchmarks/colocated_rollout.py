"""The hf engine colocated with the actor on one GPU: weight sync in the actor's process against
today's trip through CPU memory, the static KV cache against the dynamic one, and the freshness of
an engine that follows the actor in place (rollout.in_actor=true on a GPU).

    python benchmarks/colocated_rollout.py                 # a GPU: every section, 0.5b and 1.5b
    python benchmarks/colocated_rollout.py --smoke         # tiny, on CPU, seconds (tests/test_benchmark_scripts.py)

Needs torch, transformers, omegaconf and the checkout (no Ray, no install). Sections (--sections):

fresh   rollout.in_actor=true as the actor's worker runs it (workers/rollout_worker.py): the actor
        (FSDP2, float32 weights, bf16 compute) and a bf16 engine (static KV cache) that copies its parameters in place,
        on the device, at each sync. |engine log p − actor log p| per sampled token, token mean: before
        training, after a train step and a sync, and after a second step without a sync (the stale
        engine a broken sync leaves, which rollout.max_logp_gap must tell apart).
engine  HFEngine with the dynamic cache against the static one (compiled decoding on a GPU) on one
        model and the same prompts: sampled tokens/s (prompts × samples, up to --new-tokens each; the
        first call, which compiles, timed apart; then the two engines alternate) and greedy outputs,
        row by row.
sync    the actor's weights into a bf16 engine model on the same GPU, per model size: today's path
        (FSDP2Strategy.full_state_dict to CPU, cast, one flat buffer per dtype, back into tensors, copied
        to the GPU; Ray's object store put / get, which today's path adds on top, is left out, so it is
        a lower bound) against the in-place device copy (HFEngine.update_weights(own_parameters())).
        Both must leave the engine holding exactly the actor's weights cast to bf16.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run from a checkout without an install (the GPU machine)

import torch  # noqa: E402

try:
    import roll_lite.workers  # noqa: F401
except ModuleNotFoundError:  # a checkout that is not installed (the GPU machine): workers/ is roll_lite.workers
    import importlib

    sys.modules["roll_lite.workers"] = importlib.import_module("workers")

from mfu import SIZES  # noqa: E402  (Qwen2 shapes; the script's folder is on sys.path)

SECTIONS = ("fresh", "engine", "sync")  # the order they run in


def timed(fn, sync) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def model_config(size: str) -> dict:
    return dict(SIZES[size], model_type="qwen2", max_position_embeddings=4096)


def gap(strategy, prompts, completions, pad_token_id: int) -> float:
    """Token mean of |engine log p − actor log p| over the sampled tokens."""
    from roll_lite.data.sequences import build_sequence_batch

    batch = build_sequence_batch(prompts, completions.token_ids, pad_token_id, completions.log_probs)
    actor = strategy.compute_log_probs(batch)["log_probs"]
    mask = batch["response_mask"].bool()
    return float((actor[mask] - batch["rollout_log_probs"][mask]).abs().mean())


def fresh(device, smoke: bool) -> None:
    from roll_lite.workers.rollout_worker import RolloutWorker

    from roll_lite.config import RunConfig
    from roll_lite.loss import ppo_policy_loss_func
    from roll_lite.loss.checker import random_rl_batch
    from roll_lite.model.modeling import load_causal_lm
    from roll_lite.model.tokenizer import load_tokenizer
    from roll_lite.rollout import SamplingParams
    from roll_lite.strategy import FSDP2Strategy, StrategyConfig

    config = RunConfig()
    config.rollout.in_actor, config.rollout.dtype, config.rollout.hf_static_cache = True, "bfloat16", True
    config.workers.gpus_per_rank = int(device.type == "cuda")
    tokenizer = load_tokenizer(None)
    lm = load_causal_lm(config.model, len(tokenizer), seed=0)
    strategy = FSDP2Strategy(lm, StrategyConfig(param_dtype="bfloat16", lr=3e-3, use_packing=True), device=device)
    worker = RolloutWorker(config, actor_weights=strategy.own_parameters)
    print(worker.describe())
    prompts = [[5 + i, 6, 7 + i % 5] for i in range(4 if smoke else 32)]
    params = SamplingParams(max_new_tokens=8 if smoke else 32, num_samples=4 if smoke else 8)
    repeated = [p for p in prompts for _ in range(params.num_samples)]
    train = random_rl_batch(num_rows=8, seq_len=32, vocab_size=len(tokenizer), seed=1, dtype=torch.float32)
    loss = ppo_policy_loss_func("token-mean")
    rows = [("before training", gap(strategy, repeated, worker.generate(prompts, params), tokenizer.pad_token_id))]
    strategy.train_step(train, loss)
    seconds = timed(
        lambda: worker.use_actor_weights(1), torch.cuda.synchronize if device.type == "cuda" else lambda: None
    )
    rows.append(
        (
            f"after a step and a sync ({seconds * 1e3:.2f} ms)",
            gap(strategy, repeated, worker.generate(prompts, params), tokenizer.pad_token_id),
        )
    )
    strategy.train_step(train, loss)
    rows.append(
        (
            "after a step without a sync (stale)",
            gap(strategy, repeated, worker.generate(prompts, params), tokenizer.pad_token_id),
        )
    )
    print("\n| engine vs actor | mean abs log-prob gap |\n|---|---|")
    for what, value in rows:
        print(f"| {what} | {value:.5f} |")


def sync_times(size: str, device, repeats: int) -> str:
    from roll_lite.model.modeling import build_causal_lm
    from roll_lite.model.weights import flatten_state_dict, unflatten_state_dict
    from roll_lite.rollout import HFEngine
    from roll_lite.strategy import FSDP2Strategy, StrategyConfig

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with device:  # initialised where they live: at 1.5 B a CPU init took most of the section's time
        engine = HFEngine(build_causal_lm(model_config(size), dtype=torch.bfloat16, seed=1), 0, 1)
        actor = build_causal_lm(model_config(size), dtype=torch.float32, seed=0)
    strategy = FSDP2Strategy(actor, StrategyConfig(param_dtype="bfloat16"), trainable=False, device=device)
    parts = {"gather to CPU": [], "cast + flatten + unflatten": [], "into the engine": []}

    def through_cpu():
        start = time.perf_counter()
        state = strategy.full_state_dict()
        sync()
        mid = time.perf_counter()
        state = unflatten_state_dict(flatten_state_dict({n: t.to(torch.bfloat16) for n, t in state.items()}))
        end = time.perf_counter()
        engine.update_weights(state)
        sync()
        for key, seconds in zip(parts, (mid - start, end - mid, time.perf_counter() - end)):
            parts[key].append(seconds)

    def expect_actor() -> None:
        want = {n: t.to(torch.bfloat16) for n, t in strategy.own_parameters().items()}
        got = engine.model.state_dict()
        wrong = [n for n, t in want.items() if not torch.equal(got[n], t)]
        assert not wrong, f"the engine does not hold the actor's weights: {wrong[:3]}"

    old = [timed(through_cpu, sync) for _ in range(repeats)]
    expect_actor()
    with torch.no_grad():
        for engine_tensor in engine.model.parameters():
            engine_tensor.zero_()
    new = [timed(lambda: engine.update_weights(strategy.own_parameters()), sync) for _ in range(repeats)]
    expect_actor()
    gib = sum(t.numel() * 2 for t in engine.model.state_dict().values()) / 2**30
    split = " / ".join(f"{statistics.median(v):.3f}" for v in parts.values())
    median_old, median_new = statistics.median(old), statistics.median(new)
    return (
        f"| {size} | {gib:.2f} | {median_old:.3f} ({split}) | {median_new * 1e3:.2f} ms | "
        f"{median_old / median_new:,.0f}× |"
    )


def engine_speed(size: str, device, smoke: bool, new_tokens: int, prompts_count: int, samples: int, calls: int) -> None:
    from roll_lite.model.modeling import build_causal_lm
    from roll_lite.rollout import HFEngine, SamplingParams

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    config = model_config(size)
    with device:
        model = build_causal_lm(config, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32, seed=0)
    eos = config["vocab_size"] - 1
    generator = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(2, eos, (int(torch.randint(16, 65, (1,), generator=generator)),), generator=generator).tolist()
        for _ in range(prompts_count)
    ]
    engines = {"dynamic": HFEngine(model, 0, eos, seed=0), "static": HFEngine(model, 0, eos, seed=0, static_cache=True)}
    sampled = SamplingParams(max_new_tokens=new_tokens, num_samples=samples)
    firsts, speeds, greedy = {}, {name: [] for name in engines}, {}
    for name, engine in engines.items():
        firsts[name] = timed(lambda: engine.generate(prompts, sampled), sync)
    for call in range(calls):
        for name in list(engines) if call % 2 == 0 else list(engines)[::-1]:
            out = []
            seconds = timed(lambda: out.append(engines[name].generate(prompts, sampled)), sync)
            speeds[name].append(sum(map(len, out[0].token_ids)) / seconds)
    for name, engine in engines.items():
        greedy[name] = engine.generate(prompts, SamplingParams(max_new_tokens=new_tokens, greedy=True)).token_ids
    same = sum(a == b for a, b in zip(greedy["dynamic"], greedy["static"]))
    first_differences = [
        next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        for a, b in zip(greedy["dynamic"], greedy["static"])
        if a != b and len(a) == len(b)
    ]
    print(
        f"\n{size}: {prompts_count} prompts of 16-64 tokens × {samples} samples, ≤ {new_tokens} new tokens, "
        f"{'bf16' if device.type == 'cuda' else 'float32'}\n"
    )
    print("| cache | first call s | tokens/s (median of {0}) |\n|---|---|---|".format(calls))
    for name in engines:
        print(f"| {name} | {firsts[name]:.2f} | {statistics.median(speeds[name]):,.0f} |")
    print(
        f"\ngreedy: {same} of {prompts_count} rows identical; rows that differ first differ at token "
        f"{sorted(first_differences) or '-'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    parser.add_argument("--sync-sizes", default="0.5b,1.5b")
    parser.add_argument("--engine-size", default="0.5b")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--calls", type=int, default=3, help="timed generate calls per engine after the first")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU: checks the script")
    args = parser.parse_args()
    sections = args.sections.split(",")
    if unknown := [s for s in sections if s not in SECTIONS]:
        parser.error(f"--sections: unknown {unknown}; choose from {', '.join(SECTIONS)}")
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    if args.smoke:
        args.sync_sizes, args.engine_size, args.prompts, args.samples, args.new_tokens, args.calls = (
            "tiny",
            "tiny",
            4,
            2,
            8,
            1,
        )
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"{name}; torch {torch.__version__}")
    if "fresh" in sections:
        fresh(device, args.smoke)
    if "engine" in sections:
        engine_speed(args.engine_size, device, args.smoke, args.new_tokens, args.prompts, args.samples, args.calls)
    if "sync" in sections:
        print(
            "\n| size | bf16 GiB | through CPU s (gather / cast + flatten + unflatten / into the engine) | "
            "in place on the device | ratio |\n|---|---|---|---|---|"
        )
        for size in args.sync_sizes.split(","):
            print(sync_times(size, device, repeats=1 if args.smoke else 3), flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()  # the size's models are gone with sync_times' frame


if __name__ == "__main__":
    main()
