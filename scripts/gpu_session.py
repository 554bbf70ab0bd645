"""The GPU checks of the docs in one run, for a lent GPU machine with little time: each section a
command with a time limit of its own, in order of what matters most, all under one deadline; every
line of output in one log, and a summary of what finished, failed or ran out of time.

    python3 scripts/gpu_session.py --out "$OUT" --deadline 500      # every section
    python3 scripts/gpu_session.py --out "$OUT" --only head,mfu_1.5b
    python3 scripts/gpu_session.py --list                          # the sections and their commands

The machine needs torch, transformers, omegaconf and Ray importable, and roll_lite installed (a wheel
unpacked on PYTHONPATH will do). Benchmarks run in the checkout; roll-train runs in a scratch folder
holding links to configs/ and data/, so that the checkout's roll_lite/ (which lacks pipelines/ and
workers/ until installed) does not shadow the installed one in Ray's workers, which put the driver's
working directory on their path. Its runs write there, under outputs/.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN_DIR = Path("/tmp/roll_lite_gpu_runs")
TRAIN = "python3 -m roll_lite.cli"
GPU = "workers.gpus_per_rank=1 model.dtype=float32 actor.param_dtype=bfloat16"
QWEN_1_5B_SHAPE = (
    "model.hidden_size=1536 model.intermediate_size=8960 model.num_hidden_layers=28 "
    "model.num_attention_heads=12 model.num_key_value_heads=2"
)


@dataclass(frozen=True)
class Section:
    name: str
    seconds: int  # its own limit; the deadline may cut it shorter
    command: str
    in_run_dir: bool = False  # roll-train runs (see the module's docstring)


# The workers of issue 42's fourth point, each one short job on the GPU, colocated: reward-model
# training, DPO, an RL run scored by a reward model and a judge, distillation from a teacher, the
# fully async mode. Three independent chains at once (tiny models: the GPU has room for all).
WORKERS = f"""
a() {{ {TRAIN} --config configs/reward_model.yaml run_name=rm_increment preference.train_files=data/digit_domains/increment_pairs_train.jsonl preference.eval_files=data/digit_domains/increment_pairs_eval.jsonl preference.steps=30 {GPU} &&
      {TRAIN} --config configs/sft.yaml run_name=judge_decrement sft.train_files=data/digit_domains/judge_train.jsonl sft.eval_files=data/digit_domains/judge_eval.jsonl sft.response_key=response sft.steps=30 {GPU} &&
      {TRAIN} --config configs/mixed_domains.yaml sft.steps=20 steps=3 eval_every=3 {GPU}; }}
b() {{ {TRAIN} --config configs/sft.yaml sft.steps=30 {GPU} &&
      {TRAIN} --config configs/dpo.yaml preference.steps=10 {GPU} &&
      {TRAIN} --config configs/distill.yaml distill.teacher=outputs/sft_reverse_digits/final sft.steps=20 steps=3 eval_every=3 {GPU}; }}
c() {{ {TRAIN} --config configs/grpo_async.yaml sft.steps=20 steps=4 eval_every=4 {GPU}; }}
a > chain_a.log 2>&1; echo "chain a (reward model, judge, rewards by domain): exit $?" > chain_a.exit &
b > chain_b.log 2>&1; echo "chain b (sft, dpo, distillation): exit $?" > chain_b.exit &
c > chain_c.log 2>&1; echo "chain c (fully async): exit $?" > chain_c.exit &
wait
for x in a b c; do cat chain_$x.exit; grep -E "Error|error:|Traceback" chain_$x.log | head -20; tail -n 4 chain_$x.log; done
grep -q "exit 0" chain_a.exit && grep -q "exit 0" chain_b.exit && grep -q "exit 0" chain_c.exit
"""

SECTIONS = (
    Section(
        "env",
        30,
        "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "
        "\"import torch, transformers, ray, omegaconf, roll_lite; print('torch', torch.__version__, "
        "'transformers', transformers.__version__, 'ray', ray.__version__, 'omegaconf', omegaconf.__version__, "
        'torch.cuda.get_device_name(0))"',
    ),
    Section(
        "head",
        60,
        "python3 benchmarks/head_speed.py --entropy && python3 benchmarks/head_speed.py --entropy --chunk 4096",
    ),
    Section(
        "mfu_1.5b",
        200,
        "python3 benchmarks/mfu.py --sizes 1.5b --variants off,ac,compile --steps 3 --profile",
    ),
    Section(
        "grpo_1.5b",
        150,
        f"python3 {REPO}/benchmarks/gpu_run.py --workdir . --config configs/grpo_gpu.yaml sft.steps=0 steps=21 "
        f"eval_every=100 rollout.prompts_per_step=16 rollout.num_samples=8 rollout.max_new_tokens=64 "
        f"rollout.in_actor=true {QWEN_1_5B_SHAPE}",
        in_run_dir=True,
    ),
    Section("engine_sync", 120, "python3 benchmarks/colocated_rollout.py --sections engine,sync"),
    Section("workers", 150, WORKERS, in_run_dir=True),
    Section("mfu_0.5b", 60, "python3 benchmarks/mfu.py --sizes 0.5b --variants off --steps 3"),
)


def run_section(section: Section, limit: float, log) -> str:
    cwd = REPO
    if section.in_run_dir:
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        for name in ("configs", "data"):
            if not (RUN_DIR / name).exists():
                (RUN_DIR / name).symlink_to(REPO / name)
        cwd = RUN_DIR
    log.write(f"\n===== {section.name} (limit {limit:.0f} s) =====\n$ {section.command.strip()}\n")
    log.flush()
    start = time.monotonic()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen(
        ["bash", "-c", section.command], cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    try:
        code = process.wait(timeout=limit)
        outcome = "ok" if code == 0 else f"failed (exit {code})"
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.wait()
        outcome = "out of time"
    # a run cut short leaves its cluster (the module, not the `ray` script: a wheel unpacked on PYTHONPATH has none)
    subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True)
    return f"{outcome} in {time.monotonic() - start:.0f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".", help="folder for session.log and summary.md")
    parser.add_argument("--deadline", type=float, default=500, help="seconds for the whole session")
    parser.add_argument("--only", default=None, help="comma-separated section names, in the order given")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    by_name = {section.name: section for section in SECTIONS}
    chosen = SECTIONS if args.only is None else tuple(by_name[name] for name in args.only.split(","))
    if args.list:
        for section in chosen:
            print(f"{section.name} ({section.seconds} s): {section.command.strip()}\n")
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start, summary = time.monotonic(), []
    with open(out / "session.log", "w") as log:
        for section in chosen:
            left = args.deadline - (time.monotonic() - start)
            if left < 20:
                summary.append(f"| {section.name} | not started: {left:.0f} s left |")
                continue
            summary.append(f"| {section.name} | {run_section(section, min(section.seconds, left), log)} |")
            (out / "summary.md").write_text("| section | outcome |\n|---|---|\n" + "\n".join(summary) + "\n")
            print(summary[-1], flush=True)
    sys.exit(0 if all("| ok" in line for line in summary) else 1)


if __name__ == "__main__":
    main()
