"""The algorithm menu side by side on the byo example: GRPO, GSPO, CISPO, DAPO and GRPO training LoRA
adapters from the same SFT model, with the same seeds and step budget; the held-out reward (greedy,
`math`, 128 problems) at the start and the end, and DAPO's filtered fraction and extra sampling.

    python benchmarks/algorithm_menu.py                  # 5 rows x seeds 0, 1; ~30 min on 2 cores
    python benchmarks/algorithm_menu.py --seeds 0 --steps 20 --algorithms grpo cispo
    python benchmarks/algorithm_menu.py --algorithms grpo grpo_lora   # full fine-tuning vs LoRA r=16

It builds the byo assets and runs its SFT (examples/byo/sft.yaml) when outputs/byo_sft/final is
missing, then one `roll-train --config examples/byo/grpo.yaml` per (algorithm, seed), as a user would,
and reads each run's metrics.jsonl.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SFT_MODEL = REPO / "outputs/byo_sft/final"
ALGORITHMS = {
    "grpo": [],
    "gspo": ["algorithm.policy_loss=gspo", "algorithm.loss_agg_mode=seq-mean-token-mean"],
    "cispo": ["algorithm.policy_loss=cispo"],
    # DAPO as configs/dapo.yaml: clip-higher, token-mean, no KL, dynamic sampling, overlong shaping and
    # filtering; byo solutions take ~18 of rollout.max_new_tokens=24 tokens, so the last 4 cost
    "dapo": [
        "algorithm.clip_ratio_low=0.2",
        "algorithm.clip_ratio_high=0.28",
        "algorithm.dynamic_sampling=true",
        "algorithm.max_sampling_rounds=3",
        "algorithm.overlong_buffer=4",
        "algorithm.overlong_filter=true",
    ],
    # GRPO training LoRA adapters (rank 16, alpha 32, every Linear but the LM head) on the frozen SFT model,
    # at 10x the full fine-tuning learning rate, as is usual for LoRA; the rollout engine gets the adapters only
    "grpo_lora": ["actor.lora.rank=16", "actor.lora.alpha=32", "actor.lr=1e-3"],
}


def roll_train(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "roll_lite.cli", *args], cwd=REPO, check=True, capture_output=True)


def ensure_sft_model() -> None:
    if SFT_MODEL.exists():
        return
    subprocess.run([sys.executable, "-m", "examples.byo.build", "outputs/byo", "--overwrite"], cwd=REPO, check=True)
    roll_train("--config", "examples/byo/sft.yaml")


def run(algorithm: str, seed: int, steps: int, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        roll_train(
            "--config",
            "examples/byo/grpo.yaml",
            *ALGORITHMS[algorithm],
            f"seed={seed}",
            f"steps={steps}",
            f"eval_every={steps}",
            f"output_dir={out}",
            "run_name=menu",
            "save_model=false",
            *extra,
        )
        wall = time.perf_counter() - start
        records = [json.loads(line) for line in (Path(out) / "menu" / "metrics.jsonl").read_text().splitlines()]
    steps_run = [r for r in records if "perf/step_s" in r]
    evals = [r["eval/reward_mean"] for r in records if r.get("eval/reward_mean") is not None]
    row = {
        "algorithm": algorithm,
        "seed": seed,
        "start": evals[0],
        "end": evals[-1],
        "wall_s": wall,
        "step_s": statistics.median(r["perf/step_s"] for r in steps_run),
    }
    if algorithm == "dapo":
        row["kept"] = statistics.mean(r["dapo/informative_groups"] for r in steps_run)
        row["extra_rounds"] = statistics.mean(r["dapo/extra_rounds"] for r in steps_run)
        row["filtered"] = statistics.mean(r["dapo/overlong_filtered"] for r in steps_run)
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| algorithm | seed | held-out start | held-out end | median step s | wall s | DAPO: groups kept | extra rounds / step | overlong filtered |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        dapo = f"{r['kept']:.2f} | {r['extra_rounds']:.2f} | {r['filtered']:.3f}" if "kept" in r else "— | — | —"
        lines.append(
            f"| {r['algorithm']} | {r['seed']} | {r['start']:.3f} | {r['end']:.3f} | {r['step_s']:.2f} | "
            f"{r['wall_s']:.0f} | {dapo} |"
        )
    means = {}
    for r in rows:
        means.setdefault(r["algorithm"], []).append(r["end"] - r["start"])
    lines.append("")
    lines.append(
        "mean change of the held-out reward over the seeds: "
        + ", ".join(f"{name} {statistics.mean(d):+.3f}" for name, d in means.items())
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("overrides", nargs="*", help="key=value overrides for every run (e.g. workers.torch_threads=1)")
    args = parser.parse_args()
    ensure_sft_model()
    rows = []
    for seed in args.seeds:  # seed-major: the algorithms of one seed run back to back
        for algorithm in args.algorithms:
            rows.append(run(algorithm, seed, args.steps, args.overrides))
            print(
                f"{algorithm} seed {seed}: {rows[-1]['start']:.3f} -> {rows[-1]['end']:.3f} "
                f"({rows[-1]['wall_s']:.0f} s)",
                flush=True,
            )
    print(table(rows))


if __name__ == "__main__":
    main()
