"""Step time and held-out reward of the full pipeline on Ray, in the setup of TRL's GRPOTrainer bar
(2 prompts × 8 completions, 16 new tokens, lr 1e-4, no KL), and of the default PPO run.

    python benchmarks/pipeline_step.py            # both rows, ~9 min on 2 cores
    python benchmarks/pipeline_step.py grpo       # one row

Each row runs `roll-train` as a user would and reads its metrics.jsonl.
"""

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETUPS = {
    "grpo": [
        "--config",
        "configs/grpo.yaml",
        "rollout.prompts_per_step=2",
        "actor.lr=1e-4",
        "rollout.max_new_tokens=16",
        "algorithm.track_kl=false",
    ],
    "ppo": ["--config", "configs/ppo.yaml"],
}


def run(name: str) -> dict:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "roll_lite.cli", *SETUPS[name], f"output_dir={out}", "run_name=bench"],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        wall = time.perf_counter() - start
        records = [json.loads(line) for line in (Path(out) / "bench" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "perf/step_s" in r]
    evals = [r["eval/reward_mean"] for r in records if r.get("eval/reward_mean") is not None]
    median = lambda key: statistics.median(r[key] for r in steps)  # noqa: E731
    return {
        "setup": name,
        "steps": len(steps),
        "step_s": median("perf/step_s"),
        "generate_s": median("perf/generate_s"),
        "train_s": median("perf/train_s"),
        "sync_s": median("perf/weight_sync_s"),
        "tokens_per_s": median("perf/tokens_per_s"),
        "reward_start": evals[0],
        "reward_end": evals[-1],
        "wall_s": wall,
    }


def main():
    names = sys.argv[1:] or list(SETUPS)
    if unknown := [name for name in names if name not in SETUPS]:
        raise SystemExit(f"{__doc__}\nunknown setup {', '.join(unknown)}; choose from {', '.join(SETUPS)}")
    rows = [run(name) for name in names]
    print(
        "| setup | steps | median step s | generate s | train s | weight sync s | tokens/s | held-out start → end | wall s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['setup']} | {r['steps']} | {r['step_s']:.3f} | {r['generate_s']:.3f} | {r['train_s']:.3f} | "
            f"{r['sync_s']:.3f} | {r['tokens_per_s']:.0f} | {r['reward_start']:.3f} → {r['reward_end']:.3f} | {r['wall_s']:.0f} |"
        )


if __name__ == "__main__":
    main()
