"""What the numbers of a CPU run depend on, and what `reproducible=portable` costs: the same training
under each kernel setting and thread count, each in a fresh process whose environment holds the
setting's variables from the start (roll_lite/runtime/reproducibility.py), fingerprinted bit for bit.

Each process builds the demo's actor model (~1 M-parameter Qwen2 of configs/ppo.yaml) from seed 0,
takes `--steps` AdamW steps on fixed random token batches, then decodes greedily; AdamW is foreach,
or fused in the portable rows as a portable run's strategy makes it (StrategyConfig.adamw_fused). Printed
per setting: sha256 of the final weights and of the greedy tokens, whether they equal the baseline's
(machine, 2 threads) and portable's, the largest weight difference, and the median step time. The cost
of portable is the ratio of its median step time to machine's, over `--rounds` interleaved rounds of both.

    python benchmarks/determinism.py [--steps 30] [--rounds 3] [--no-extra] [--emulate Haswell-v1,EPYC-Rome]

To compare two machines, run it on both: equal fingerprints in the portable rows mean the same run.
`--emulate` runs portable's process again under qemu-user (qemu-x86_64-static -cpu NAME) for each CPU
model named: another CPU, AVX2 only, on this machine (its step times are the emulator's).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
from pathlib import Path

from roll_lite.runtime.reproducibility import KERNEL_VARIABLES, kernel_env

PORTABLE = kernel_env("portable")
# (name, environment, torch threads, fused AdamW); the interleaved timing rounds of machine and portable come first.
TIMED = [("machine", {}, 2, False), ("portable", PORTABLE, 2, True)]
EXTRA = [
    ("machine, 1 thread", {}, 1, False),
    ("portable, 1 thread", PORTABLE, 1, True),
    ("portable with foreach AdamW (MKL's vector math sqrt)", PORTABLE, 2, False),
    ("ATEN_CPU_CAPABILITY=avx2 alone", {"ATEN_CPU_CAPABILITY": "avx2"}, 2, False),
    ("MKL_CBWR=COMPATIBLE alone", {"MKL_CBWR": "COMPATIBLE"}, 2, False),
    ("MKL_CBWR=AVX2 alone (MKL's Intel-only branch)", {"MKL_CBWR": "AVX2"}, 2, False),
    ("portable + MKL_ENABLE_INSTRUCTIONS=AVX2", {**PORTABLE, "MKL_ENABLE_INSTRUCTIONS": "AVX2"}, 2, True),
]
QEMU = "qemu-x86_64-static"
WARM_UP_STEPS = 3  # left out of the step-time median


def train_and_decode(steps: int, threads: int, hidden: int | None, fused: bool) -> dict:
    import time

    import torch

    from roll_lite.config import RunConfig
    from roll_lite.model.modeling import load_causal_lm

    torch.set_num_threads(threads)
    model_config = RunConfig().model
    if hidden is not None:  # the test's tiny size
        model_config.hidden_size, model_config.intermediate_size, model_config.num_hidden_layers = hidden, 2 * hidden, 1
    model = load_causal_lm(model_config, vocab_size=16, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, **({"fused": True} if fused else {"foreach": True}))
    batches = torch.Generator().manual_seed(1)
    step_times = []
    for _ in range(steps):
        tokens = torch.randint(0, 16, (16, 24), generator=batches)
        start = time.perf_counter()
        loss = model(input_ids=tokens, labels=tokens, use_cache=False).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step_times.append(time.perf_counter() - start)
    model.eval()
    prompts = torch.randint(0, 16, (32, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        greedy = model.generate(prompts, max_new_tokens=24, do_sample=False, pad_token_id=0)[:, 8:]
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return {
        "weights": weights.tolist(),
        "weights_sha": hashlib.sha256(weights.numpy().tobytes()).hexdigest(),
        "greedy": greedy.tolist(),
        "greedy_sha": hashlib.sha256(greedy.numpy().tobytes()).hexdigest(),
        "step_s": statistics.median(step_times[WARM_UP_STEPS:] or step_times),
        "kernels": torch.backends.cpu.get_cpu_capability(),
    }


def run_child(args, env: dict[str, str], threads: int, fused: bool, emulate: str | None = None) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in KERNEL_VARIABLES}
    command = [sys.executable, __file__, "--steps", str(args.steps), "--child", str(threads)]
    if emulate is not None:
        command = [QEMU, "-cpu", emulate, *command]
    if args.hidden is not None:
        command += ["--hidden", str(args.hidden)]
    if fused:
        command += ["--fused"]
    out = subprocess.run(command, env={**clean, **env}, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(
            f"the child for {env or 'machine'}{' under ' + emulate if emulate else ''} failed:\n{out.stderr[-3000:]}"
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def machine_summary() -> str:
    import torch

    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.M)
    flags_line = re.search(r"^flags\s*:\s*(.*)$", cpuinfo, re.M)
    flags = set(flags_line.group(1).split()) if flags_line else set()
    isa = ", ".join(
        f"{name} {'yes' if flag in flags else 'no'}"
        for name, flag in (
            ("AVX2", "avx2"),
            ("FMA", "fma"),
            ("AVX-512F", "avx512f"),
            ("AVX-512 BF16", "avx512_bf16"),
            ("AMX", "amx_tile"),
        )
    )
    config = torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version (\S+)", config)
    onednn = re.search(r"MKL-DNN (v[\d.]+)", config)
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = ""
    return (
        f"{datetime.date.today()}, commit {commit or '?'}, {model.group(1) if model else platform.processor()} "
        f"({os.cpu_count()} cores; {isa}); torch {torch.__version__}, MKL {mkl.group(1) if mkl else '?'}, "
        f"oneDNN {onednn.group(1) if onednn else '?'}, Python {platform.python_version()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved machine / portable runs, for the cost")
    parser.add_argument("--no-extra", action="store_true", help="only the timed machine / portable rounds")
    parser.add_argument(
        "--emulate",
        default="",
        help=f"CPU models for {QEMU} -cpu, comma-separated: "
        "portable's process again on each (e.g. Haswell-v1,EPYC-Rome)",
    )
    parser.add_argument(
        "--hidden", type=int, default=None, help="a smaller model: hidden size, 1 layer (the test's 16)"
    )
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--fused", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(train_and_decode(args.steps, args.child, args.hidden, args.fused)))
        return
    rows, times = [], {name: [] for name, _, _, _ in TIMED}
    for round_index in range(args.rounds):
        order = TIMED if round_index % 2 == 0 else TIMED[::-1]  # neither always runs first
        for name, env, threads, fused in order:
            result = run_child(args, env, threads, fused)
            times[name].append(result["step_s"])
            rows.append((name if round_index == 0 else f"{name} again (round {round_index + 1})", env, threads, result))
    rows.sort(key=lambda row: (row[0].split(" again")[0] != "machine", row[0]))
    for name, env, threads, fused in [] if args.no_extra else EXTRA:
        rows.append((name, env, threads, run_child(args, env, threads, fused)))
    for cpu in filter(None, args.emulate.split(",")):
        rows.append((f"portable under qemu -cpu {cpu}", PORTABLE, 2, run_child(args, PORTABLE, 2, True, emulate=cpu)))

    base, portable_base = rows[0][3], next(row[3] for row in rows if row[0] == "portable")
    print(f"{args.steps} AdamW steps of the demo's actor, then 32 × 24 greedy tokens; {machine_summary()}\n")
    print(
        "| setting | threads | torch kernels | weights sha256 | greedy tokens sha256 | weights = machine's | "
        "weights = portable's | largest weight difference | greedy tokens that differ | median step |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, _env, threads, result in rows:
        diff = max(abs(a - b) for a, b in zip(result["weights"], base["weights"]))
        tokens = sum(a != b for ra, rb in zip(result["greedy"], base["greedy"]) for a, b in zip(ra, rb))
        same, same_portable = (
            "yes" if result["weights_sha"] == other["weights_sha"] else "no" for other in (base, portable_base)
        )
        print(
            f"| {name} | {threads} | {result['kernels']} | {result['weights_sha'][:16]} | {result['greedy_sha'][:16]} | "
            f"{same} | {same_portable} | {diff:.1e} | {tokens} of {len(base['greedy']) * len(base['greedy'][0])} | "
            f"{1000 * result['step_s']:.1f} ms |"
        )
    machine, portable = times["machine"], times["portable"]
    ratios = [p / m for m, p in zip(machine, portable)]
    print(
        f"\nportable / machine, median step time over {args.rounds} interleaved rounds: "
        f"{statistics.median(portable) / statistics.median(machine):.2f} (per round: "
        f"{', '.join(f'{r:.2f}' for r in ratios)}; machine {', '.join(f'{1000 * t:.1f}' for t in machine)} ms, "
        f"portable {', '.join(f'{1000 * t:.1f}' for t in portable)} ms)"
    )
    print(f"portable's variables: {' '.join(f'{k}={v}' for k, v in PORTABLE.items())}, and fused AdamW")


if __name__ == "__main__":
    main()
