"""On-policy distillation against GRPO alone, on the digit-reversal task, on a CPU:

  0. the teacher: the GRPO demo (configs/grpo.yaml), unless --teacher names a policy folder;
  1. the student's start: configs/distill.yaml's smaller model after the same SFT warm start on the
     noisy demonstrator (configs/sft.yaml on `demonstration`);
  2. from that start, with the same steps, prompts and seed: pure OPD with each signal (the
     advantage of configs/distill.yaml, the reverse KL's k2 estimate as a loss, the forward KL over
     the teacher's top 8), GRPO alone on the exact-answer reward, and OPD mixed with the reward
     (distill.reward_weight=1).

Prints the held-out reward (greedy, the rule) at every evaluation of each run, with the training
seconds spent by then (the sum of perf/step_s), the teacher's, and each distilling run's teacher
cost (its share of the step, tokens/s, peak memory). docs/distillation.md holds the last tables.
Run it where configs/ and data/ are (the repository root):

    python examples/distill/compare.py                       # ~20 min on 2 CPU cores
    python examples/distill/compare.py --teacher outputs/grpo_reverse_digits/final

Extra arguments go to every roll-train as overrides. Outputs: outputs/distill_* (replaced each time).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

SEED = 0
STUDENT = ["model.hidden_size=64", "model.intermediate_size=256"]  # as configs/distill.yaml
START = "model.pretrained_path=outputs/distill_student_sft/final"


def stages(teacher: str | None) -> dict[str, list[str]]:
    runs = {}
    if teacher is None:
        teacher = "outputs/distill_teacher/final"
        runs["teacher"] = ["--config", "configs/grpo.yaml", "run_name=distill_teacher"]
    runs["student_sft"] = [
        "--config",
        "configs/sft.yaml",
        "run_name=distill_student_sft",
        "sft.response_key=demonstration",
        "sft.eval_files=[]",
        "sft.steps=1200",
        *STUDENT,
    ]
    distill = ["--config", "configs/distill.yaml", START, "sft.steps=0", f"distill.teacher={teacher}"]
    runs["opd"] = [*distill, "run_name=distill_opd"]
    runs["rkl"] = [*distill, "distill.signal=reverse_kl", "distill.kl_estimator=k2", "run_name=distill_rkl"]
    runs["topk"] = [*distill, "distill.signal=top_k_forward_kl", "distill.top_k=8", "run_name=distill_topk"]
    runs["grpo"] = ["--config", "configs/grpo.yaml", START, "sft.steps=0", *STUDENT, "run_name=distill_grpo"]
    runs["mixed"] = [*distill, "distill.reward_weight=1.0", "run_name=distill_mixed"]
    return runs


def records(run: str) -> list[dict]:
    return [json.loads(line) for line in (Path("outputs") / run / "metrics.jsonl").read_text().splitlines()]


def curve(run: str) -> list[tuple[int, float, float]]:
    """(step, training seconds by then, held-out reward) at each evaluation of a run."""
    seconds, points = 0.0, []
    for record in records(run):
        seconds += record.get("perf/step_s", 0.0)
        if "eval/reward_mean" in record:
            points.append((record["step"], seconds, record["eval/reward_mean"]))
    return points


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", help="a trained policy folder; default: train the GRPO demo first")
    args, overrides = parser.parse_known_args(argv)
    runs = stages(args.teacher)
    for name, arguments in runs.items():
        run = next(a.removeprefix("run_name=") for a in arguments if a.startswith("run_name="))
        shutil.rmtree(Path("outputs") / run, ignore_errors=True)
        command = [sys.executable, "-m", "roll_lite.cli", *arguments, f"seed={SEED}", *overrides]
        print(f"== {name}: roll-train {' '.join(command[3:])}", flush=True)
        subprocess.run(command, check=True)
    labels = {
        "opd": "OPD advantage",
        "rkl": "OPD reverse KL (k2)",
        "topk": "OPD top-8 forward KL",
        "grpo": "GRPO alone",
        "mixed": "OPD + reward",
    }
    curves = {name: curve(f"distill_{name}") for name in labels}
    print("\n| step | " + " | ".join(labels.values()) + " |\n|---|" + "---|" * len(labels))
    for points in zip(*curves.values()):
        cells = [f"{reward:.3f} ({seconds:.0f} s)" for _, seconds, reward in points]
        print(f"| {points[0][0]} | " + " | ".join(cells) + " |")
    print(
        "\n| run | step s | teacher s | teacher share | teacher tokens/s | teacher peak GiB |\n|---|---:|---:|---:|---:|---:|"
    )
    for name, label in labels.items():
        steps = [r for r in records(f"distill_{name}") if "perf/step_s" in r]
        mean = lambda key: sum(r.get(key, 0.0) for r in steps) / len(steps)  # noqa: E731
        peak = max(r.get("teacher/peak_memory_gib", 0.0) for r in steps)
        print(
            f"| {label} | {mean('perf/step_s'):.3f} | {mean('perf/teacher_s'):.3f} | "
            f"{mean('perf/teacher_s') / mean('perf/step_s'):.0%} | {mean('teacher/tokens_per_s'):,.0f} | {peak:.2f} |"
        )
    if "teacher" in runs:
        print(f"\nteacher (GRPO demo): held-out {curve('distill_teacher')[-1][2]:.3f}")


if __name__ == "__main__":
    main()
