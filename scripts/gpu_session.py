"""The GPU checks of the docs in one run, for a lent GPU machine with little time: each section a
command with a time limit of its own, in order of what matters most, all under one deadline; every
line of output in one log, and a summary of what finished, failed or ran out of time.

    python3 scripts/gpu_session.py --out "$OUT" --deadline 500      # every section
    python3 scripts/gpu_session.py --out "$OUT" --only head,mfu_1.5b
    python3 scripts/gpu_session.py --list                          # the sections and their commands

The machine needs torch, transformers, omegaconf, datasets and Ray importable, and roll_lite installed
(a wheel unpacked on PYTHONPATH will do). The lent machines have torch and transformers but no
registry, and take 64 MiB with the checkout: `--pack` (here, with the registry) writes .gpu/, the
missing packages as one .tar.xz of ~26 MB (Ray without its Java jars and the libraries we do not use,
its binaries stripped) and roll_lite's wheel, and prints the command that unpacks them there and runs
the session (`carry: [".gpu"]`).

Benchmarks run in the checkout. roll-train runs in a scratch folder holding links to configs/ and
data/ (its runs write there, under outputs/), so that the only roll_lite on any process's path is the
installed one: the checkout's roll_lite/ lacks pipelines/ and workers/ until installed.
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
# each chain's lines go into the log as they come, marked, so that a chain cut by the time limit
# still shows how far it got; the exit lines say which finished
rm -f chain_?.exit
(a; code=$?; echo "chain a (reward model, judge, rewards by domain): exit $code"; echo $code > chain_a.exit) 2>&1 | sed -u 's/^/[a] /' &
(b; code=$?; echo "chain b (sft, dpo, distillation): exit $code"; echo $code > chain_b.exit) 2>&1 | sed -u 's/^/[b] /' &
(c; code=$?; echo "chain c (fully async): exit $code"; echo $code > chain_c.exit) 2>&1 | sed -u 's/^/[c] /' &
wait
[ "$(cat chain_a.exit chain_b.exit chain_c.exit | tr -d '\n')" = 000 ]
"""

# Their limits come from the H100 runs of 2026-11-27 (what each took, or ran out at, in brackets). All
# of them take more than a session's 15 minutes of device time: pick with --only.
SECTIONS = (
    Section(  # [13 s]
        "env",
        30,
        "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "
        "\"import torch, transformers, ray, omegaconf, datasets, roll_lite; print('torch', torch.__version__, "
        "'transformers', transformers.__version__, 'ray', ray.__version__, 'omegaconf', omegaconf.__version__, "
        'torch.cuda.get_device_name(0))"',
    ),
    Section(  # [41 s]
        "head",
        60,
        "python3 benchmarks/head_speed.py --entropy && python3 benchmarks/head_speed.py --entropy --chunk 4096",
    ),
    Section(  # [off and ac: under 200 s together, with the profile]
        "mfu_1.5b",
        200,
        "python3 benchmarks/mfu.py --sizes 1.5b --variants off,ac --steps 3 --profile",
    ),
    Section(  # [the first step compiling: more than 90 s]
        "mfu_compile",
        300,
        "python3 benchmarks/mfu.py --sizes 1.5b --variants off,compile,ac+compile --steps 3",
    ),
    Section(  # [150 s: actor 41 s, engine 19 s, step-0 eval 22 s, no step yet]
        "grpo_1.5b",
        360,
        f"python3 {REPO}/benchmarks/gpu_run.py --workdir . --config configs/grpo_gpu.yaml sft.steps=0 steps=21 "
        f"eval_every=100 algorithm.track_kl=false rollout.prompts_per_step=8 rollout.num_samples=8 "
        f"rollout.max_new_tokens=48 model.max_position_embeddings=128 rollout.in_actor=true {QWEN_1_5B_SHAPE}",
        in_run_dir=True,
    ),
    Section("sync", 90, "python3 benchmarks/colocated_rollout.py --sections sync"),  # [not run yet]
    Section(  # [nothing printed in 120 s: the first call compiles decoding]
        "engine",
        300,
        "python3 benchmarks/colocated_rollout.py --sections engine",
    ),
    Section("workers", 300, WORKERS, in_run_dir=True),  # [more than 150 s, three chains at once]
    Section("mfu_0.5b", 60, "python3 benchmarks/mfu.py --sizes 0.5b --variants off --steps 3"),  # [41 s]
)


# Python packages the lent GPU machines lack (their image has torch, transformers, peft, pyarrow, ...)
CARRIED = (
    "ray==2.60.0",
    "omegaconf==2.4.0",
    "antlr4-python3-runtime==4.13.2",
    *("jsonschema", "referencing", "jsonschema-specifications", "rpds-py"),  # Ray's
    *("datasets==5.2.0", "dill", "multiprocess"),  # roll_lite.data reads files through datasets
)
RAY_UNUSED = ("jars", "rllib", "data", "serve", "tune", "train", "llm")
RAY_BINARIES = ("_raylet.so", "core/src/ray/gcs/gcs_server", "core/src/ray/raylet/raylet")
DEVICE_COMMAND = (
    'export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1; python3 -c "import tarfile, zipfile, glob; '
    "tarfile.open('.gpu/site.tar.xz').extractall('/tmp'); "
    "[zipfile.ZipFile(w).extractall('/tmp/site') for w in glob.glob('.gpu/*.whl')]\" && "
    "python3 scripts/gpu_session.py --out $OUT --deadline 540"
)


def pack(folder: Path) -> None:
    """Write folder/site.tar.xz (CARRIED for CPython 3.12 on x86-64) and roll_lite's wheel."""
    import shutil
    import tarfile
    import tempfile
    import zipfile

    folder.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheels, site = Path(tmp) / "wheels", Path(tmp) / "site"
        platforms = [
            f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
        ]
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version=3.12"]
            + ["--implementation=cp", *platforms, "-d", str(wheels), *CARRIED],
            check=True,
        )
        for wheel in wheels.glob("*.whl"):
            zipfile.ZipFile(wheel).extractall(site)
        for name in RAY_UNUSED:
            shutil.rmtree(site / "ray" / name, ignore_errors=True)
        for source_map in (site / "ray" / "dashboard").rglob("*.map"):
            source_map.unlink()
        for binary in RAY_BINARIES:
            subprocess.run(["strip", "--strip-unneeded", str(site / "ray" / binary)], check=True)
        with tarfile.open(folder / "site.tar.xz", "w:xz") as archive:
            archive.add(site, arcname="site")
    for old in folder.glob("roll_lite-*.whl"):
        old.unlink()
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(folder), str(REPO)],
        check=True,
    )
    size = sum(f.stat().st_size for f in folder.iterdir()) / 2**20
    print(f"{folder}: {size:.1f} MiB; ignore it in .git/info/exclude, carry it, and run there:\n{DEVICE_COMMAND}")


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
    if section.in_run_dir:  # a roll-train run cut short leaves its Ray cluster (the module, not the `ray`
        # script: a wheel unpacked on PYTHONPATH has none)
        subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True)
    return f"{outcome} in {time.monotonic() - start:.0f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".", help="folder for session.log and summary.md")
    parser.add_argument("--deadline", type=float, default=500, help="seconds for the whole session")
    parser.add_argument("--only", default=None, help="comma-separated section names, in the order given")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--pack", action="store_true", help="write .gpu/ here (needs the registry), then stop")
    args = parser.parse_args()
    if args.pack:
        pack(REPO / ".gpu")
        return
    by_name = {section.name: section for section in SECTIONS}
    names = list(by_name) if args.only is None else args.only.split(",")
    unknown = [name for name in names if name not in by_name]
    if unknown:
        parser.error(f"--only: no section {', '.join(unknown)}; the sections: {', '.join(by_name)}")
    chosen = tuple(by_name[name] for name in names)
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
