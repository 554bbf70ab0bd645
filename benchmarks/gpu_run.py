"""A `roll-train` run on GPU, as a user runs it, summed up: step time split, tokens/s, train-step MFU
and peak memory. Needs a CUDA machine with the project installed (ray included).

    python benchmarks/gpu_run.py --config configs/grpo_gpu.yaml                 # the digit demo on one GPU
    python benchmarks/gpu_run.py --config configs/grpo_gpu.yaml sft.steps=0 steps=10 \\
        model.hidden_size=896 model.intermediate_size=4864 model.num_hidden_layers=24 \\
        model.num_attention_heads=14 model.num_key_value_heads=2                # a Qwen2.5-0.5B-shaped model

MFU counts 6 · N · T FLOPs per train step (N parameters, LM head included once when tied; T tokens
trained: prompt + response), over perf/train_s, against the GPU's dense bf16 peak (--peak-tflops).
It leaves out attention's own FLOPs, which are small at these lengths. GPU memory: the actor's peak
allocated by torch (actor/peak_memory_gib, the largest step) and the whole device's peak use
(nvidia-smi, every process on the GPU, sampled every 0.5 s). The train / inference gap: |Δ log p|
between the engine's log-prob of each sampled token and the actor's (median over steps of the token
mean, and the largest).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
DENSE_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # vendor figures, dense (no sparsity)


def parameter_count(config_path: str, overrides: list[str]) -> int:
    from roll_lite.config import load_config
    from roll_lite.model.modeling import load_causal_lm
    from roll_lite.model.tokenizer import load_tokenizer

    config = load_config(config_path, overrides)
    tokenizer = load_tokenizer(config.model.tokenizer_path)
    with torch.device("meta"):
        model = load_causal_lm(config.model, len(tokenizer), seed=0)
    return sum(p.numel() for p in model.parameters())  # a tied LM head is one tensor, counted once


class GpuMemorySampler(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.peak_mib, self.stop = 0, threading.Event()

    def run(self):
        while not self.stop.is_set():
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
            )
            if out.returncode == 0:
                self.peak_mib = max([self.peak_mib] + [int(x) for x in out.stdout.split()])
            self.stop.wait(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak of the GPU; default: by name")
    parser.add_argument(
        "--workdir", default=str(REPO), help="where roll-train runs (relative paths); default the checkout"
    )
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    os.chdir(args.workdir)  # the config's relative paths, here and in roll-train
    if not torch.cuda.is_available():
        sys.exit("benchmarks/gpu_run.py needs a CUDA GPU (torch sees none); on CPU use benchmarks/pipeline_step.py")
    name = torch.cuda.get_device_name(0)
    peak = args.peak_tflops or next((v for k, v in DENSE_BF16_TFLOPS.items() if k in name), None)
    if peak is None:
        sys.exit(f"{name}: pass --peak-tflops (the GPU's dense bf16 TFLOP/s)")
    n_params = parameter_count(args.config, args.overrides)

    with tempfile.TemporaryDirectory() as out:
        sampler = GpuMemorySampler()
        sampler.start()
        start = time.perf_counter()
        command = [
            sys.executable,
            "-m",
            "roll_lite.cli",
            "--config",
            args.config,
            *args.overrides,
            f"output_dir={out}",
            "run_name=gpu_run",
            "checkpoint.enabled=false",
        ]
        done = subprocess.run(command)
        wall = time.perf_counter() - start
        sampler.stop.set()
        metrics_file = Path(out) / "gpu_run" / "metrics.jsonl"
        records = [json.loads(line) for line in metrics_file.read_text().splitlines()] if metrics_file.exists() else []
    steps = [r for r in records if "perf/step_s" in r][1:]  # the first step pays CUDA / allocator warm-up
    if done.returncode != 0:
        print(f"roll-train stopped (exit {done.returncode}) after {len(steps) + 1} steps: {' '.join(command)}")
        if not steps:
            sys.exit(1)
    median = lambda key: statistics.median(r[key] for r in steps)  # noqa: E731
    tokens = statistics.median(r["perf/tokens_per_s"] * r["perf/step_s"] for r in steps)
    train_tflops = 6 * n_params * tokens / median("perf/train_s") / 1e12
    evals = [r["eval/reward_mean"] for r in records if r.get("eval/reward_mean") is not None]
    print(
        f"\n{name}; {n_params / 1e6:.1f} M parameters; {len(steps)} steps after the first; "
        f"{' '.join(args.overrides) or 'no overrides'}\n"
    )
    print(
        "| step s | generate s | prepare s | train s | weight sync s | tokens/step | tokens/s | train TFLOP/s | "
        "train MFU | actor peak GiB | GPU peak GiB (all processes) | engine vs actor |Δ log p| mean / max | "
        "held-out reward | wall s |"
    )
    print("|" + "---|" * 14)
    reward = f"{evals[0]:.3f} → {evals[-1]:.3f}" if evals else "no eval"
    gap = (
        f"{median('actor/rollout_logp_gap'):.4f} / {max(r['actor/rollout_logp_gap_max'] for r in steps):.3f}"
        if "actor/rollout_logp_gap" in steps[0]
        else "-"
    )
    actor_peak = max((r.get("actor/peak_memory_gib", float("nan")) for r in steps), default=float("nan"))
    print(
        f"| {median('perf/step_s'):.3f} | {median('perf/generate_s'):.3f} | {median('perf/prepare_s'):.3f} | "
        f"{median('perf/train_s'):.3f} | {median('perf/weight_sync_s'):.3f} | {tokens:,.0f} | "
        f"{median('perf/tokens_per_s'):,.0f} | {train_tflops:.1f} | {train_tflops / peak:.1%} | {actor_peak:.2f} | "
        f"{sampler.peak_mib / 1024:.2f} | {gap} | {reward} | {wall:.0f} |"
    )


if __name__ == "__main__":
    main()
