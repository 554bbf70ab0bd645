"""Train-step throughput, MFU, peak memory and where the step's time goes, for Qwen2-shaped models
built from config, through FSDP2Strategy: packed micro-batches of a token budget, the PPO policy loss
(token-mean) on GRPO-like rows, AdamW; with and without activation checkpointing and compiled layers.

    python benchmarks/mfu.py                       # a GPU: 201m, 0.5b, 1.5b × off, ac, compile, ac+compile, bf16
    python benchmarks/mfu.py --sizes 48m --rows 8 --seq-len 1024 --budget 2048 --steps 2   # the CPU run in the docs
    python benchmarks/mfu.py --smoke               # tiny, on CPU, seconds (tests/test_benchmark_scripts.py)

Each size × variant runs in a process of its own (a fresh allocator, compile cache in memory and
peak; --smoke on CPU: a fork of this one after its imports, benchmarks/forked.py). Variants: off; ac
(model.gradient_checkpointing: each decoder layer recomputed in backward); compile
(model.compile_layers); ac+compile. The memory and time ratios are against `off` of the
same size, in the same run.

MFU = model FLOPs per step / step time / the device's dense peak (--peak-tflops; by GPU name else;
none on CPU). Model FLOPs, printed both ways:
  6·N·T          N = the parameters that multiply (all but the input embedding; a tied LM head
                 counted once, as the head), T = the step's real tokens; attention's own FLOPs left out;
  + attention    6·N·T + 6·L·d·Σ s²: QKᵀ and AV are 2·s²·d FLOPs each per layer forward for a sequence
                 of s tokens (d = heads · head dim), half of that under the causal mask, ×3 with
                 backward; s runs over the packed sequences, not the packs.
Recomputation (checkpointing, the chunked head's backward) is not counted: every variant does the
same model FLOPs. Peak memory: on a GPU torch's max_memory_allocated; on CPU the process's peak
resident memory (VmHWM) above what it held before building the model (weights, gradients, AdamW
state and activations), large allocations mmapped so that freed memory leaves the resident set.
"Above rest": that peak less what is held between steps (weights, gradients, AdamW state), i.e.
what a step adds, mostly activations: the part checkpointing shrinks.

The split comes from one more step with hooks that synchronize the GPU at every mark (so it is
timed apart from the steps above): decoder forward; decoder backward (the recomputation with ac);
the log-probs head, forward and backward (roll_lite/model/logprobs.py); the optimizer step; other (the
loss, grad-norm clipping, micro-batching, FSDP2's root).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from forked import run_forked
from logprob_memory import _ratio, _status  # a ratio (nan over 0); resident memory from /proc/self/status

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run from a checkout without an install (the GPU machine)

VOCAB_QWEN = 151936
SIZES = {  # Qwen2 shapes: Qwen2.5-0.5B's and -1.5B's dimensions, cuda_check.py's 201M, engines.py's 48M
    "tiny": dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    ),
    "48m": dict(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        tie_word_embeddings=True,
    ),
    "201m": dict(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=12,
        num_attention_heads=16,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    ),
    "0.5b": dict(
        vocab_size=VOCAB_QWEN,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
    "1.5b": dict(
        vocab_size=VOCAB_QWEN,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
}
VARIANTS = {"off": (False, False), "ac": (True, False), "compile": (False, True), "ac+compile": (True, True)}
SPLIT = ("decoder forward", "decoder backward", "head", "optimizer", "other")


def flop_counts(model_config: dict, lm, data) -> tuple[float, float]:
    """(6·N·T, 6·L·d·Σ s²) of one step over `data` (see the module's docstring)."""
    embedding, head = lm.get_input_embeddings().weight, lm.get_output_embeddings().weight
    n_matmul = sum(p.numel() for p in lm.parameters() if p is not embedding and p is not head) + head.numel()
    lengths = data["attention_mask"].sum(-1).double()
    attention_dim = model_config["hidden_size"]  # heads × head dim in these shapes
    return 6.0 * n_matmul * float(lengths.sum()), 6.0 * model_config["num_hidden_layers"] * attention_dim * float(
        (lengths**2).sum()
    )


class PhaseTimer:
    """Wall time per phase of train steps, from hooks on the model, the loss and the optimizer."""

    def __init__(self, strategy, sync):
        self.sync, self.times, self.phase, self.start = sync, dict.fromkeys(SPLIT, 0.0), "other", 0.0
        model, handles = strategy.model, []
        decoder = model.decoder
        handles.append(model.register_forward_pre_hook(lambda *_: self.switch("decoder forward")))
        handles.append(decoder.get_input_embeddings().register_forward_hook(self._embedded))
        handles.append(decoder.register_forward_hook(self._decoder_done))
        handles.append(model.register_forward_hook(lambda *_: self.switch("other")))  # the loss
        self.handles, self.optimizer = handles, strategy.optimizer
        self.optimizer_step = optimizer_step = strategy.optimizer.step

        def timed_step(*args, **kwargs):
            self.switch("optimizer")
            result = optimizer_step(*args, **kwargs)
            self.switch("other")
            return result

        strategy.optimizer.step = timed_step

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.optimizer.step = self.optimizer_step

    def _embedded(self, _module, _inputs, output) -> None:
        output.register_hook(lambda _grad: self.switch("other"))  # the decoder's backward is done

    def _decoder_done(self, _module, _inputs, output) -> None:
        self.switch("head")
        output.last_hidden_state.register_hook(lambda _grad: self.switch("decoder backward"))  # the head's is done

    def wrap_loss(self, loss_func):
        def timed(micro_batch, output):
            result = loss_func(micro_batch, output)
            self.switch("head")  # backward starts with the head
            return result

        return timed

    def switch(self, phase: str) -> None:
        self.sync()
        now = time.perf_counter()
        if self.start:
            self.times[self.phase] += now - self.start
        self.phase, self.start = phase, now


MEASURE_IMPORTS = (  # measure's
    "roll_lite.loss.checker",
    "roll_lite.model.compiling",
    "roll_lite.model.modeling",
    "roll_lite.strategy",
)


def measure(spec: dict) -> dict:
    """In this process: one size × variant (spec from main), its step times, FLOPs, peak and split."""
    import torch

    from roll_lite.loss import ppo_policy_loss_func
    from roll_lite.loss.checker import random_rl_batch
    from roll_lite.model.compiling import compile_decoder_layers
    from roll_lite.model.modeling import build_causal_lm, enable_gradient_checkpointing
    from roll_lite.strategy import FSDP2Strategy, StrategyConfig

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    baseline = _status("VmRSS")
    shape = spec["model"] if "model" in spec else SIZES[spec["size"]]  # largest_model.py passes its own shapes
    model_config = dict(shape, model_type="qwen2", max_position_embeddings=spec["seq_len"])
    checkpointing, compiled = VARIANTS[spec["variant"]]
    lm = build_causal_lm(model_config, dtype=torch.float32, seed=0)
    if checkpointing:
        enable_gradient_checkpointing(lm)
    if compiled:
        compile_decoder_layers(lm)
    data = random_rl_batch(
        num_rows=spec["rows"],
        seq_len=spec["seq_len"],
        vocab_size=model_config["vocab_size"],
        seed=1,
        dtype=torch.float32,
    )
    dense_flops, attention_flops = flop_counts(model_config, lm, data)
    config = StrategyConfig(
        param_dtype=spec["dtype"], lr=1e-5, use_packing=True, max_tokens_per_micro_batch=spec["budget"]
    )
    strategy = FSDP2Strategy(lm, config, device=device)
    loss_func = ppo_policy_loss_func("token-mean")

    def step(loss=loss_func) -> tuple[float, dict]:
        sync()
        start = time.perf_counter()
        metrics = strategy.train_step(data, loss)
        sync()
        return time.perf_counter() - start, metrics

    try:
        first, metrics = step()  # the compile, the allocator's and AdamW state's first use
        times = [step()[0] for _ in range(spec["steps"])]
        peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else _status("VmHWM") - baseline
        # between steps: weights, gradients, AdamW state; what a step adds above that is mostly activations
        rest = torch.cuda.memory_allocated() if device.type == "cuda" else _status("VmRSS") - baseline
        timer = PhaseTimer(strategy, sync)
        timer.switch("other")
        step(timer.wrap_loss(loss_func))
        timer.switch("other")
        timer.remove()
        profile = profile_step(step, device) if spec.get("profile") else None
    except torch.OutOfMemoryError as error:
        return {"oom": str(error).splitlines()[0]}
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    return {
        "params": sum(p.numel() for p in lm.parameters()),
        "tokens": int(data["attention_mask"].sum()),
        "micro_batches": int(metrics["num_micro_batches"]),
        "first_s": first,
        "step_s": sorted(times)[len(times) // 2],
        "dense_flops": dense_flops,
        "attention_flops": attention_flops,
        "peak_bytes": peak,
        "graphs": graphs,
        "above_rest_bytes": peak - rest,
        "split": {phase: seconds / sum(timer.times.values()) for phase, seconds in timer.times.items()},
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "profile": profile,
    }


def profile_step(step, device) -> str:
    """One more step under torch.profiler: the top kernels (operators on CPU) by their own time, and on
    a GPU the share of the step's wall time that kernels ran (the rest: gaps, the GPU waiting)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        seconds = step()[0]
    averages = prof.key_averages()
    sort_by = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    text = averages.table(sort_by=sort_by, row_limit=15, max_name_column_width=80)
    if device.type == "cuda":
        from torch.autograd import DeviceType

        # the kernels' own rows: an operator's row (aten::mm) holds its kernels' time again
        kernel_s = sum(event.self_device_time_total for event in averages if event.device_type == DeviceType.CUDA) / 1e6
        text += f"\nkernels ran {kernel_s:.3f} s of the profiled step's {seconds:.3f} s ({kernel_s / seconds:.0%})"
    return text


def run_child(spec: dict, timeout: float | None = None, fork: bool = False) -> dict:
    """measure(spec) in a fresh process, or with `fork` (on CPU) a fork of this one, its imports done (~5 CPU s
    less, its peak ~10 MiB above a fresh process's); {'failed': ...} if it stopped without a result."""
    import torch

    if fork and not torch.cuda.is_available():  # CUDA does not work in a fork of a process that initialized it
        for module in MEASURE_IMPORTS:  # here, once for every fork
            importlib.import_module(module)
        return run_forked(measure, spec, timeout=timeout, mmap_threshold=65536)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}  # freed large blocks leave the resident set
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--one", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"failed": f"no result in {timeout} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"failed": f"exit {done.returncode}: " + (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def peak_tflops(device_name: str, given: float | None) -> float | None:
    from gpu_run import DENSE_BF16_TFLOPS

    return given or next((tflops for key, tflops in DENSE_BF16_TFLOPS.items() if key in device_name), None)


def row(size: str, variant: str, result: dict, reference: dict | None, peak: float | None) -> str:
    if "params" not in result:
        return f"| {size} | {variant} | {result.get('oom') and 'out of memory' or result.get('failed')} |"
    step_s = result["step_s"]
    tflops = result["dense_flops"] / step_s / 1e12
    with_attention = (result["dense_flops"] + result["attention_flops"]) / step_s / 1e12
    mfu = f"{tflops / peak:.1%} | {with_attention / peak:.1%}" if peak else "- | -"
    ratios = "- | - | -"
    if reference and "params" in reference and variant != "off":
        ratios = " | ".join(
            f"{_ratio(result[key], reference[key]):.2f}" for key in ("peak_bytes", "above_rest_bytes", "step_s")
        )
    split = " / ".join(f"{result['split'][phase]:.0%}" for phase in SPLIT)
    return (
        f"| {size} | {variant} | {result['params'] / 1e6:,.1f} M | {result['tokens']:,} | {result['micro_batches']} | "
        f"{result['first_s']:.2f} | {step_s:.3f} | {result['tokens'] / step_s:,.0f} | {tflops:.2f} | {mfu} | "
        f"{result['peak_bytes'] / 2**30:.2f} | {result['above_rest_bytes'] / 2**30:.2f} | {ratios} | {split} | "
        f"{result['graphs']} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="201m,0.5b,1.5b", help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--rows", type=int, default=64, help="rows of the batch (random lengths up to --seq-len)")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--budget", type=int, default=16384, help="tokens per packed micro-batch")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (median) after the first")
    parser.add_argument("--dtype", default=None, help="compute dtype; default bfloat16 on a GPU, float32 on CPU")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's dense peak; default: by GPU name")
    parser.add_argument("--profile", action="store_true", help="print each run's top kernels (torch.profiler)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads; default torch's")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes on CPU, one thread, no compile: checks the script"
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: one measurement, JSON on stdout
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(json.loads(args.one))))
        return
    if args.smoke:
        args.sizes, args.rows, args.seq_len, args.budget, args.steps, args.threads = "tiny", 8, 64, 128, 1, 1
        if args.variants == ",".join(VARIANTS):
            args.variants = "off,ac"  # compiling takes tens of seconds (tests/test_compile_layers.py does it)
    sizes, variants = args.sizes.split(","), args.variants.split(",")
    for name, chosen, known in (("--sizes", sizes, SIZES), ("--variants", variants, VARIANTS)):
        unknown = [item for item in chosen if item not in known]
        if unknown:
            parser.error(f"{name}: unknown {unknown}; choose from {', '.join(known)}")
    import torch

    dtype = args.dtype or ("bfloat16" if torch.cuda.is_available() else "float32")
    print(
        f"torch {torch.__version__}; {args.rows} rows of up to {args.seq_len} tokens, packed micro-batches of "
        f"≤ {args.budget} tokens, {dtype} compute (float32 weights and AdamW), median of {args.steps} steps after the first\n"
    )
    print(
        "| size | variant | params | tokens/step | micro-batches | first step s | step s | tokens/s | TFLOP/s (6·N·T) | "
        "MFU 6·N·T | MFU + attention | peak GiB | step's peak above rest GiB | peak / off | above rest / off | time / off | "
        f"split: {' / '.join(SPLIT)} | compiled graphs |"
    )
    print("|" + "---|" * 18)
    for size in sizes:
        reference = None
        for variant in variants:
            spec = dict(
                size=size,
                variant=variant,
                rows=args.rows,
                seq_len=args.seq_len,
                budget=args.budget,
                steps=args.steps,
                dtype=dtype,
                threads=args.threads,
                profile=args.profile,
            )
            result = run_child(spec, fork=args.smoke)
            reference = result if variant == "off" else reference
            print(
                row(size, variant, result, reference, peak_tflops(result.get("device", "cpu"), args.peak_tflops)),
                flush=True,
            )
            if result.get("profile"):  # at once, on stderr (the table stays whole): a run cut short keeps it
                print(f"\n{size}, {variant}:\n{result['profile']}\n", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
