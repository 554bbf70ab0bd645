"""Responses of long-tail lengths: lockstep, one step ahead and the fully async mode, in the same run.

    python benchmarks/async_long_tail.py [--steps 20] [--rounds 2] [--long-share 0.15]
                                         [--modes lockstep,ahead,async,greedy] [--smoke]

The task is the demo's digit reversal with prompt lengths drawn from a long tail: most prompts 3-7
digits, a --long-share of them 16-32, so that a batch's longest answer is several times its median
(the answer is as long as the prompt). The data is written fresh (roll_lite.data.digits, seed 0), the
model is the demo's with room for the long rows (model.max_position_embeddings=80, ≤ 40 new tokens),
and one SFT warm start on the noisy demonstrator teaches it answers of the prompts' lengths; every mode
then starts from that model. Each mode is a `roll-train` run of --steps GRPO steps (4 prompts x 8
samples, a rollout worker of its own, workers.torch_threads=1, so that the two processes that compute
get a core each: workers.backend=ray, where auto would run all but greedy in one process; --smoke leaves
it to auto):

- lockstep: the step's batch is generated whole, then the step trains (every step waits for its longest answer);
- ahead: rollout.async_steps=1, the next batch generated while a step trains, whole, one version old;
- async: rollout.fully_async, max_staleness 1: while a step trains the next batch generates
  rollout.segment_tokens (half the token limit by default); rows longer than that go on under the new
  weights (partial rollouts);
- greedy: the same bound, rollout.schedule=greedy: the next batch advances 4 tokens at a time for as long
  as the step trains.

Each of --rounds rounds runs every mode once, in an order rotated from round to round. The table gives,
per mode, the median over rounds of: the median step time (perf/step_s, steps after the first 2),
samples per second, the share of a step the trainer waits for its batch (perf/generate_s / step), the
mean and the longest response (tokens), the share of samples whose tokens span two weight versions
(rollout/mixed_version_share), and the step time against lockstep's in the same round.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from async_multi_turn import step_summary  # noqa: E402  (the script's folder is on sys.path)
from vs_trl import run_checked  # noqa: E402

FULLY_ASYNC = ["rollout.fully_async=true", "rollout.max_staleness=1", "algorithm.rollout_is=token"]
MODES = {
    "lockstep": [],
    "ahead": ["rollout.async_steps=1", "algorithm.rollout_is=token"],
    "async": FULLY_ASYNC,
    "greedy": [*FULLY_ASYNC, "rollout.schedule=greedy", "rollout.segment_tokens=4"],
}
PROMPTS, SAMPLES = 4, 8  # per step; --smoke: 2 x 2
SHORT, LONG = (3, 7), (16, 32)  # digits
ROOM = ["model.max_position_embeddings=80", "data.max_prompt_length=40", "rollout.max_new_tokens=40"]
SMOKE_MODEL = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_attention_heads=2"]


def long_tail_rows(count: int, long_share: float, rng: random.Random) -> list[dict]:
    from roll_lite.data.digits import CORRECT_FRACTION, make_row, noisy_demonstration

    rows = []
    for _ in range(count):
        low, high = LONG if rng.random() < long_share else SHORT
        row = make_row("".join(rng.choice("0123456789") for _ in range(rng.randint(low, high))))
        row["demonstration"] = noisy_demonstration(row["prompt"], row["answer"], CORRECT_FRACTION, rng)
        rows.append(row)
    return rows


def roll_train(work: Path, name: str, config: str, overrides: list[str]) -> list[dict]:
    command = [sys.executable, "-m", "roll_lite.cli", "--config", str(REPO / config), *overrides]
    run_checked(command + [f"output_dir={work}", f"run_name={name}", "checkpoint.every=0"], REPO)
    return [json.loads(line) for line in (work / name / "metrics.jsonl").read_text().splitlines()]


def warm_start(work: Path, sft_steps: int) -> Path:
    data = [f"sft.train_files={work / 'train.jsonl'}", f"sft.eval_files={work / 'eval.jsonl'}"]
    overrides = [*data, "sft.response_key=demonstration", f"sft.steps={sft_steps}", f"sft.eval_every={sft_steps}"]
    roll_train(work, "sft", "configs/sft.yaml", [*overrides, ROOM[0]])
    return work / "sft" / "final"


def run_mode(mode: str, work: Path, model: list[str], steps: int, smoke: bool, round_: int) -> dict[str, float]:
    """`model`: the warm start's folder as an override, or (--smoke) the tiny shape built from config."""
    prompts, samples = (2, 2) if smoke else (PROMPTS, SAMPLES)
    overrides = [
        *model,
        *([] if smoke else ["workers.backend=ray"]),
        f"data.train_files={work / 'train.jsonl'}",
        f"data.eval_files={work / 'eval.jsonl'}",
        *ROOM,
        "sft.steps=0",
        f"steps={steps}",
        f"eval_every={steps}",
        "save_model=false",
        "algorithm.track_kl=false",
        "workers.torch_threads=1",
        "rollout.in_actor=false",
        f"rollout.prompts_per_step={prompts}",
        f"rollout.num_samples={samples}",
        *MODES[mode],
    ]
    records = roll_train(work, f"{mode}_r{round_}", "configs/grpo.yaml", overrides)
    timed, summary = step_summary(records, steps, prompts * samples)
    return {
        **summary,
        "length_mean": statistics.mean(r["response_length/mean"] for r in timed),
        "length_max": max(r["response_length/max"] for r in timed),
        "mixed": statistics.mean(r.get("rollout/mixed_version_share", 0.0) for r in timed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--long-share", type=float, default=0.15, help="the share of prompts of 16-32 digits")
    parser.add_argument("--sft-steps", type=int, default=600)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument(
        "--smoke", action="store_true", help="3 steps, lockstep and async, a tiny model without a warm start, 1 round"
    )
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.rounds, args.modes, args.sft_steps = 3, 1, "lockstep,async", 0
    modes = args.modes.split(",")
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory(prefix="roll_lite_long_tail_") as scratch:
        work = Path(scratch)
        rng = random.Random(0)
        for name, count in (("train", 4000), ("eval", 64)):
            rows = long_tail_rows(count, args.long_share, rng)
            (work / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        # --smoke: the tiny shape from config, no warm start
        model = SMOKE_MODEL if args.smoke else [f"model.pretrained_path={warm_start(work, args.sft_steps)}"]
        for round_ in range(args.rounds):
            for mode in modes[round_ % len(modes) :] + modes[: round_ % len(modes)]:
                results[mode].append(run_mode(mode, work, model, args.steps, args.smoke, round_))
                print(f"round {round_ + 1} {mode}: {results[mode][-1]['step_s']:.3f} s/step", file=sys.stderr)
    print(
        f"\n{args.steps} steps x {args.rounds} round(s); {args.long_share:.0%} of prompts {LONG[0]}-{LONG[1]} digits, "
        f"the rest {SHORT[0]}-{SHORT[1]}; SFT warm start of {args.sft_steps} steps\n"
    )
    print(
        "| mode | step s | samples/s | trainer waits | response tokens mean / max | samples of two versions | step vs lockstep |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for mode in modes:
        runs = results[mode]
        median = lambda key: statistics.median(r[key] for r in runs)  # noqa: E731
        ratio = "—"
        if "lockstep" in results and mode != "lockstep":
            ratio = f"{statistics.median(r['step_s'] / b['step_s'] for r, b in zip(runs, results['lockstep'])):.2f}×"
        print(
            f"| {mode} | {median('step_s'):.3f} | {median('rows_per_s'):.1f} | {median('trainer_wait'):.0%} "
            f"| {median('length_mean'):.1f} / {max(r['length_max'] for r in runs):.0f} | {median('mixed'):.0%} | {ratio} |"
        )


if __name__ == "__main__":
    main()
