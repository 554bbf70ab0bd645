"""Does the exact rollout mode change what a bfloat16 run learns? The demo's GRPO (configs/grpo.yaml) in
bfloat16, each variant from the same seeds, each run a fresh `roll-train` process (workers.backend=local):

  default          the hf engine as shipped; the actor recomputes the old log-probs (the PPO ratio's π_old)
  default, bypass  the engine's bfloat16 log-probs as π_old (algorithm.rollout_bypass): the mismatch enters
                   every ratio
  exact, bypass    rollout.exact: the engine's log-probs are the actor's bit for bit, so bypass is exact and
                   the old-log-prob pass is saved

Printed per variant, over the seeds (median [min-max]): the held-out reward at the start and the end, the
mean over steps of the engine/trainer gap (|Δ log-prob| p99 and max, the share of ratios outside the band),
and the seconds a step takes. The timing column is only as good as the box was idle.

    python benchmarks/exact_learning.py [--seeds 3] [--steps 40] [--sft-steps 300] [--variants default,bypass,exact]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {
    "default": ("default", []),
    "bypass": ("default, bypass", ["algorithm.rollout_bypass=true"]),
    "exact": ("exact, bypass", ["rollout.exact=true", "algorithm.rollout_bypass=true"]),
}
MISMATCH = "rollout/mismatch/hf-bfloat16"


def run(variant: str, seed: int, args, out: Path) -> dict:
    name = f"{variant}_{seed}"
    command = [sys.executable, "-m", "roll_lite.cli", "--config", "configs/grpo.yaml"]
    command += [f"steps={args.steps}", f"sft.steps={args.sft_steps}", f"eval_every={args.eval_every}", f"seed={seed}"]
    command += ["actor.param_dtype=bfloat16", "workers.backend=local", f"output_dir={out}", f"run_name={name}"]
    command += VARIANTS[variant][1]
    subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    records = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    held_out = [r["eval/reward_mean"] for r in records if r.get("eval/reward_mean") is not None]
    steps = [r for r in records if f"{MISMATCH}/tokens" in r]
    return {
        "start": held_out[0],
        "end": held_out[-1],
        "p99": statistics.mean(r[f"{MISMATCH}/logp_gap_p99"] for r in steps),
        "max": statistics.mean(r[f"{MISMATCH}/logp_gap_max"] for r in steps),
        "out": statistics.mean(r[f"{MISMATCH}/ratio_out_of_band"] for r in steps),
        "step_s": statistics.median(r["perf/step_s"] for r in steps if "perf/step_s" in r),
    }


def spread(values: list[float], fmt: str) -> str:
    return f"{format(statistics.median(values), fmt)} [{format(min(values), fmt)}-{format(max(values), fmt)}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--variants", default="default,bypass,exact")
    args = parser.parse_args()
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; choose from {sorted(VARIANTS)}")
    results: dict[str, list[dict]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):  # interleaved: a slow minute of the box hits every variant alike
            for variant in variants:
                results[variant].append(run(variant, seed, args, Path(tmp)))
                print(f"# seed {seed} {variant}: {results[variant][-1]}", file=sys.stderr)
    print(f"{args.seeds} seeds, {args.steps} steps after {args.sft_steps} SFT steps, bfloat16; median [min-max]")
    print("| variant | held-out at start | held-out at the end | \\|Δ\\| p99 | \\|Δ\\| max | out of band | step s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for variant in variants:
        rows = results[variant]
        cells = [spread([r[k] for r in rows], f) for k, f in [("start", ".3f"), ("end", ".3f")]]
        cells += [spread([r[k] for r in rows], f) for k, f in [("p99", ".1e"), ("max", ".1e"), ("out", ".2%")]]
        cells.append(spread([r["step_s"] for r in rows], ".3f"))
        print(f"| {VARIANTS[variant][0]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
