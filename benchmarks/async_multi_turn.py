"""Multi-turn RL with a slow tool: lockstep against the fully async mode, in the same run.

    python benchmarks/async_multi_turn.py [--steps 20] [--rounds 2] [--latency-ms 20,200]
                                          [--modes lockstep,async,async_2turns,greedy] [--smoke]

The task is configs/multiturn.yaml's guess-the-number, whose every reset and step first waits a time
drawn from --latency-ms (uniform; fixed per game and turn, so every mode meets the same waits): a
stand-in for a tool call or a sandbox. Each mode is a `roll-train` run of --steps steps on the same
rows, model and settings (the config's model, no warm start, 4 games x 4 samples per step, 8
environment processes, workers.torch_threads=1, a rollout worker of its own in every mode, so that the
two processes that compute get a core each: workers.backend=ray, where auto would run lockstep in one
process; --smoke leaves it to auto):

- lockstep: the step's trajectories play to their end, then the step trains (rollout.fully_async=false);
- async: rollout.fully_async, max_staleness 1, one round of turns of the next batch while a step trains
  (rollout.segment_turns=1), algorithm.rollout_is=token;
- async_2turns: the same with two rounds per step;
- greedy: rollout.schedule=greedy, rounds for as long as a step trains.

Each of --rounds rounds runs every mode once, in an order rotated from round to round. The table gives,
per mode, the median over rounds of: the median step time (perf/step_s, steps after the first 2), the
trajectories per second, the share of a step the trainer waits for its batch (perf/generate_s / step),
the environments' seconds per trajectory, and the step time against lockstep's in the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FULLY_ASYNC = ["rollout.fully_async=true", "rollout.max_staleness=1", "algorithm.rollout_is=token"]
MODES = {
    "lockstep": [],
    "async": FULLY_ASYNC,
    "async_2turns": [*FULLY_ASYNC, "rollout.segment_turns=2"],
    "greedy": [*FULLY_ASYNC, "rollout.schedule=greedy"],
}
GAMES, SAMPLES, PROCESSES = 4, 4, 8  # per step, environment processes; --smoke: 2 x 2, 2
SMOKE_MODEL = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_attention_heads=2"]

ENVIRONMENT = '''
import random
import time

from roll_lite.environments.guess_the_number import GuessTheNumber


class ToolLatencyGuess(GuessTheNumber):
    """guess_the_number whose reset and step each first wait lo..hi ms, fixed per (secret, turn)."""

    def __init__(self, latency_ms=(20, 200), **kwargs):
        super().__init__(**kwargs)
        self.latency_ms = latency_ms

    def _wait(self):
        lo, hi = self.latency_ms
        time.sleep(random.Random(f"{self.secret}-{self.turn}").uniform(lo, hi) / 1000)

    def reset(self, seed=None, secret=None, lo=None, hi=None):
        observation = super().reset(seed, secret, lo, hi)
        self._wait()
        return observation

    def step(self, action):
        self._wait()
        return super().step(action)
'''


def run_mode(mode: str, work: Path, steps: int, latency: tuple[float, float], smoke: bool) -> dict[str, float]:
    games, samples, processes = (2, 2, 2) if smoke else (GAMES, SAMPLES, PROCESSES)
    kwargs = f"{{lo: 1, hi: 16, max_turns: 5, intro: 'Guess {{lo}}-{{hi}}.', latency_ms: [{latency[0]}, {latency[1]}]}}"
    command = [
        sys.executable,
        "-m",
        "roll_lite.cli",
        "--config",
        str(REPO / "configs/multiturn.yaml"),
        "environment.name=tool_latency:ToolLatencyGuess",
        f"environment.kwargs={kwargs}",
        f"data.train_files={REPO / 'data/guess_the_number/train.jsonl'}",
        f"data.eval_files={REPO / 'data/guess_the_number/eval.jsonl'}",
        "sft.steps=0",
        f"steps={steps}",
        f"eval_every={steps}",
        "save_model=false",
        "checkpoint.every=0",
        "workers.torch_threads=1",
        "rollout.in_actor=false",
        f"environment.max_concurrent={processes}",
        f"rollout.prompts_per_step={games}",
        f"rollout.num_samples={samples}",
        *(SMOKE_MODEL if smoke else ["workers.backend=ray"]),
        f"output_dir={work}",
        f"run_name={mode}",
        *MODES[mode],
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(work), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(command, cwd=work, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{mode}: roll-train failed:\n{result.stderr[-3000:]}")
    records = [json.loads(line) for line in (work / mode / "metrics.jsonl").read_text().splitlines()]
    timed, summary = step_summary(records, steps, games * samples)
    return {**summary, "env_s": statistics.median(r["env/env_s"] for r in timed)}


def step_summary(records: list[dict], steps: int, rows: int) -> tuple[list[dict], dict[str, float]]:
    """The steps after the first 2 (timed), and their median step time, rows per second and the share of
    a step the trainer waits for its batch."""
    timed = [r for r in records if "perf/step_s" in r and r["step"] > min(2, steps - 1)]
    step_s = statistics.median(r["perf/step_s"] for r in timed)
    wait = statistics.median(r["perf/generate_s"] / r["perf/step_s"] for r in timed)
    return timed, {"step_s": step_s, "rows_per_s": rows / step_s, "trainer_wait": wait}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--latency-ms", default="20,200", help="lo,hi: every reset and step waits uniform(lo, hi) ms")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="3 steps, lockstep and async, a tiny model, 2 environment processes, 1 round",
    )
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.rounds, args.modes, args.latency_ms = 3, 1, "lockstep,async", "5,10"
    modes = args.modes.split(",")
    latency = tuple(float(x) for x in args.latency_ms.split(","))
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory(prefix="roll_lite_async_mt_") as scratch:
        for round_ in range(args.rounds):
            order = modes[round_ % len(modes) :] + modes[: round_ % len(modes)]
            for mode in order:
                work = Path(scratch) / f"round{round_}"
                work.mkdir(exist_ok=True)
                (work / "tool_latency.py").write_text(ENVIRONMENT)
                results[mode].append(run_mode(mode, work, args.steps, latency, args.smoke))
                print(f"round {round_ + 1} {mode}: {results[mode][-1]['step_s']:.3f} s/step", file=sys.stderr)
    print(f"\n{args.steps} steps x {args.rounds} round(s), tool latency {latency[0]:g}-{latency[1]:g} ms\n")
    print("| mode | step s | trajectories/s | trainer waits | env s / trajectory | step vs lockstep |")
    print("|---|---:|---:|---:|---:|---:|")
    for mode in modes:
        runs = results[mode]
        ratio = "—"
        if "lockstep" in results and mode != "lockstep":
            ratio = f"{statistics.median(r['step_s'] / b['step_s'] for r, b in zip(runs, results['lockstep'])):.2f}×"
        print(
            f"| {mode} | {statistics.median(r['step_s'] for r in runs):.3f} "
            f"| {statistics.median(r['rows_per_s'] for r in runs):.1f} "
            f"| {statistics.median(r['trainer_wait'] for r in runs):.0%} "
            f"| {statistics.median(r['env_s'] for r in runs):.2f} | {ratio} |"
        )


if __name__ == "__main__":
    main()
