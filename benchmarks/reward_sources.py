"""Each reward source's scoring throughput on CPU, and its share of a GRPO step.

    python benchmarks/reward_sources.py                 # both tables: throughput, then 4 roll-train runs
    python benchmarks/reward_sources.py --smoke         # small batch, no roll-train runs (tests/test_benchmark_scripts.py)

Sources: `rule` (exact_answer, inline in the reward worker), `model` (a reward model: a Qwen2 sequence
classifier of the demo policy's size, ModelConfig's defaults, with the demo's character tokenizer, so
the policy's ids go straight in), `judge` (a Qwen2 causal LM of the same size, greedy, at most
--judge-tokens new tokens, the pointwise template) and `all` (the three together). The models are
untrained: a forward's cost does not depend on what it learned, but the untrained judge writes no
verdict, so its replies run to --judge-tokens and every one is `unparseable` (the cost of a judge
that always writes its full reply).

1. Throughput: RewardWorker.score on the demo's batch shape (4 prompts × 8 samples of the digit task,
   responses of the task's length), median of --repeats calls after a first one: responses/s.
2. Share of a step: `roll-train --config configs/grpo.yaml sft.steps=0` for --steps steps with each
   source set (reward.in_driver=false for all, so each pays the same Ray round trip), the median over
   the steps after the first of perf/reward_s and perf/step_s.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def build_models(folder: Path) -> tuple[str, str]:
    """(reward model folder, judge folder), the demo policy's size, random weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from roll_lite.config.schema import ModelConfig
    from roll_lite.model.modeling import causal_lm_config
    from roll_lite.model.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = causal_lm_config(ModelConfig(), len(tokenizer))
    config.pad_token_id, config.num_labels = tokenizer.pad_token_id, 1
    torch.manual_seed(0)
    paths = []
    for name, cls in (("reward_model", AutoModelForSequenceClassification), ("judge", AutoModelForCausalLM)):
        cls.from_config(config).save_pretrained(folder / name)
        tokenizer.save_pretrained(folder / name)
        paths.append(str(folder / name))
    return paths[0], paths[1]


def source_sets(model: str, judge: str) -> dict[str, dict]:
    rule = {"exact_answer": 1.0}
    return {
        "rule": dict(functions=rule),
        "model": dict(functions={}, models={model: 1.0}),
        "judge": dict(functions={}, judges={judge: 1.0}),
        "all": dict(functions=rule, models={model: 1.0}, judges={judge: 1.0}),
    }


def demo_batch(rows: int):
    from roll_lite.model.tokenizer import build_char_tokenizer

    tokenizer, rng = build_char_tokenizer(), random.Random(0)
    lines = (REPO / "data/reverse_digits/train.jsonl").read_text().splitlines()
    picked = [json.loads(rng.choice(lines)) for _ in range(rows)]
    prompts, answers = [row["prompt"] for row in picked], [row["answer"] for row in picked]
    responses = [a[::-1] if rng.random() < 0.5 else a for a in answers]
    sequences = [tokenizer(p + r)["input_ids"] for p, r in zip(prompts, responses)]
    return responses, answers, prompts, sequences


def throughput(sets: dict[str, dict], rows: int, repeats: int, judge_tokens: int) -> dict[str, float]:
    from roll_lite.workers.reward_worker import RewardWorker

    from roll_lite.config import RewardConfig

    responses, answers, prompts, sequences = demo_batch(rows)
    result = {}
    for name, sources in sets.items():
        worker = RewardWorker(RewardConfig(**sources, judge_max_new_tokens=judge_tokens))
        try:
            worker.score(responses, answers, None, prompts, sequences)  # first call: allocations, caches
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                worker.score(responses, answers, None, prompts, sequences)
                times.append(time.perf_counter() - start)
        finally:
            worker.close()
        result[name] = rows / statistics.median(times)
    return result


def step_share(sets: dict[str, dict], steps: int, judge_tokens: int, out: Path) -> dict[str, tuple[float, float]]:
    """(median perf/reward_s, median perf/step_s) per source set over the steps after the first."""
    result = {}
    for name, sources in sets.items():
        overrides = [
            f"reward.functions={json.dumps(sources['functions'])}",
            "reward.in_driver=false",
            f"reward.judge_max_new_tokens={judge_tokens}",
        ]
        for key in ("models", "judges"):
            if key in sources:
                overrides.append(f"reward.{key}={{{', '.join(f'{path}: {w}' for path, w in sources[key].items())}}}")
        command = [
            sys.executable,
            "-m",
            "roll_lite.cli",
            "--config",
            str(REPO / "configs/grpo.yaml"),
            "sft.steps=0",
            f"steps={steps}",
            "eval_every=1000",
            "save_model=false",
            "checkpoint.enabled=false",
            f"output_dir={out}",
            f"run_name={name}",
            *overrides,
        ]
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{name}: roll-train failed:\n{done.stderr[-2000:]}")
        records = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
        timed = [r for r in records if "perf/reward_s" in r][1:]
        result[name] = (
            statistics.median(r["perf/reward_s"] for r in timed),
            statistics.median(r["perf/step_s"] for r in timed),
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32, help="responses per scoring call (the demo's 4 × 8)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4, help="roll-train steps per source set; 0: no step table")
    parser.add_argument("--judge-tokens", type=int, default=16, help="reward.judge_max_new_tokens")
    parser.add_argument("--smoke", action="store_true", help="8 rows, one repeat, no roll-train runs")
    args = parser.parse_args()
    if args.smoke:
        args.rows, args.repeats, args.steps, args.judge_tokens = 8, 1, 0, 4
    import logging

    import torch

    torch.set_num_threads(1)  # as the reward worker runs (workers.torch_threads' default)
    logging.getLogger("roll_lite.rewards").setLevel(logging.ERROR)  # the untrained judge's warning, every call
    with tempfile.TemporaryDirectory() as tmp:
        sets = source_sets(*build_models(Path(tmp)))
        speeds = throughput(sets, args.rows, args.repeats, args.judge_tokens)
        print(f"\nscoring {args.rows} responses, median of {args.repeats}, 1 torch thread\n")
        print("| sources | responses/s | ms per call |\n|---|---|---|")
        for name, speed in speeds.items():
            print(f"| {name} | {speed:,.0f} | {1000 * args.rows / speed:.1f} |")
        if args.steps:
            shares = step_share(sets, args.steps, args.judge_tokens, Path(tmp) / "runs")
            print(f"\nroll-train --config configs/grpo.yaml, {args.steps} steps, median after the first\n")
            print("| sources | reward s | step s | reward share of the step |\n|---|---|---|---|")
            for name, (reward_s, step_s) in shares.items():
                print(f"| {name} | {reward_s:.3f} | {step_s:.3f} | {reward_s / step_s:.0%} |")


if __name__ == "__main__":
    main()
