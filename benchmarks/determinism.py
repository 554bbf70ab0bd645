"""What the numbers of a CPU run depend on: the same training, repeated under other thread counts and
CPU kernel paths, compared bit for bit with a baseline.

Each setting runs in a fresh process (the environment variables must be set before torch loads):
the demo's actor model (~1 M-parameter Qwen2 of configs/ppo.yaml) built from seed 0 takes `--steps`
AdamW steps on fixed random token batches, then decodes greedily. Printed per setting: whether the
final weights equal the baseline's bit for bit, the largest weight difference, and how many of the
greedy tokens differ.

    python benchmarks/determinism.py [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

SETTINGS = [
    ("baseline: 2 torch threads", {}, 2),
    ("the same again (a second process)", {}, 2),
    ("1 torch thread", {}, 1),
    ("ATEN_CPU_CAPABILITY=default (no SIMD in ATen's own kernels)", {"ATEN_CPU_CAPABILITY": "default"}, 2),
    ("MKL_CBWR=COMPATIBLE (MKL's ISA-independent code path)", {"MKL_CBWR": "COMPATIBLE"}, 2),
]


def train_and_decode(steps: int, threads: int) -> dict:
    import torch

    from roll_lite.config import RunConfig
    from roll_lite.modeling import load_causal_lm

    torch.set_num_threads(threads)
    model = load_causal_lm(RunConfig().model, vocab_size=16, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, foreach=True)
    batches = torch.Generator().manual_seed(1)
    for _ in range(steps):
        tokens = torch.randint(0, 16, (16, 24), generator=batches)
        loss = model(input_ids=tokens, labels=tokens, use_cache=False).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    prompts = torch.randint(0, 16, (32, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        greedy = model.generate(prompts, max_new_tokens=24, do_sample=False, pad_token_id=0)[:, 8:]
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return {"weights": weights.tolist(), "greedy": greedy.tolist(), "capability": torch.backends.cpu.get_cpu_capability()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(train_and_decode(args.steps, args.child)))
        return
    results = []
    for name, env, threads in SETTINGS:
        out = subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--child", str(threads)],
                             env={**os.environ, **env}, capture_output=True, text=True, check=True)
        results.append((name, json.loads(out.stdout.strip().splitlines()[-1])))
    base = results[0][1]
    print(f"{args.steps} AdamW steps of the demo's actor model, then 32 × 24 greedy tokens; CPU kernels here: "
          f"{base['capability']}\n")
    print("| setting | weights equal the baseline's | largest weight difference | greedy tokens that differ |")
    print("|---|---|---|---|")
    for name, result in results:
        diff = max(abs(a - b) for a, b in zip(result["weights"], base["weights"]))
        tokens = sum(a != b for ra, rb in zip(result["greedy"], base["greedy"]) for a, b in zip(ra, rb))
        print(f"| {name} | {'yes' if result['weights'] == base['weights'] else 'no'} | {diff:.2e} | "
              f"{tokens} of {32 * 24} |")


if __name__ == "__main__":
    main()
