"""The code sandbox's cost on CPU: per run by isolation layer, programs per second through the pool,
and the share of a step spent scoring code.

    python benchmarks/sandbox.py            # all three tables (the last runs configs/code.yaml briefly)
    python benchmarks/sandbox.py --smoke    # few repeats, no roll-train run (tests/test_benchmark_scripts.py)

1. Layers: the median wall time of one run of `print(1)` (--repeats runs), each row adding a layer:
   the bare interpreter (`python -I -S`, a subprocess), + prlimit's rlimits, the rlimits mode (+ the
   start marker, its own user as root, that user's processes killed after), and the bwrap mode
   (+ namespaces and the built file system); then bwrap running the code task's program (the function
   driver on 8 hidden cases). All rows use one interpreter: /usr/bin/python3 where it exists (any
   user may run it, as the rlimits mode as root needs), else this one.
2. Throughput: --programs programs, each judged through SandboxPool (one worker per core), trivial
   (`print(1)` against one stdin case) and the task's (8 function cases): programs/s.
3. Share of a step: `roll-train --config configs/code.yaml` with --sft-steps of warm start and
   --steps RL steps; the median over the steps after the first of perf/reward_s and perf/step_s.
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from roll_lite.data.integer_functions import make_row  # noqa: E402
from roll_lite.sandbox import Isolation, Limits, SandboxPool, judge, parse_tests, run_program  # noqa: E402

PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else os.path.realpath(sys.executable)


def median_ms(run, repeats: int) -> float:
    run()  # the first: page cache, imports
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def layers(repeats: int) -> list[tuple[str, float]]:
    limits = Limits()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "main.py"
        script.write_text("print(1)\n")
        os.chmod(tmp, 0o755)
        bare = [PYTHON, "-I", "-S", str(script)]
        rows = [
            ("python -I -S (bare subprocess)", median_ms(lambda: subprocess.run(bare, capture_output=True), repeats)),
            (
                "+ prlimit",
                median_ms(
                    lambda: subprocess.run(["prlimit", *limits.prlimit_args(), "--", *bare], capture_output=True),
                    repeats,
                ),
            ),
        ]
        for mode in ("rlimits", "bwrap"):
            isolation = Isolation(mode, python=PYTHON)
            argv = [PYTHON, "-I", "-S", isolation.code_path("{code}", "main.py")]
            rows.append(
                (
                    f"isolation={mode}",
                    median_ms(lambda: run_program(isolation, limits, {"main.py": "print(1)\n"}, argv), repeats),
                )
            )
    pool = SandboxPool(Isolation("bwrap", python=PYTHON), limits, workers=1)
    try:
        row = make_row(2, 5)
        tests, code = parse_tests(row["tests"]), row["answer"]
        rows.append(
            ("isolation=bwrap, the task's program (8 cases)", median_ms(lambda: judge(pool, code, tests), repeats))
        )
    finally:
        pool.close()
    return rows


def throughput(programs: int) -> list[tuple[str, int, float]]:
    pool = SandboxPool(Isolation("bwrap", python=PYTHON), Limits())
    try:
        trivial = [
            (f"print({i})\n", parse_tests({"cases": [{"stdin": "", "stdout": f"{i}\n"}]})) for i in range(programs)
        ]
        task = [
            (make_row("x*x", b)["answer"], parse_tests(make_row("x*x", b)["tests"]))
            for b in (list(range(10)) * (programs // 10 + 1))[:programs]
        ]
        rows = []
        for name, items in (("trivial (print, 1 stdin case)", trivial), ("the task's (8 function cases)", task)):
            start = time.perf_counter()
            verdicts = pool.map(lambda item: judge(pool, *item), items)
            elapsed = time.perf_counter() - start
            assert all(v.verdict == "passed" for v in verdicts), [v for v in verdicts if v.verdict != "passed"][:3]
            rows.append((name, pool.workers, programs / elapsed))
        return rows
    finally:
        pool.close()


def step_share(sft_steps: int, steps: int, out: Path) -> tuple[float, float, float]:
    """(median perf/reward_s, median perf/step_s, the last eval/reward_mean)."""
    command = [
        sys.executable,
        "-m",
        "roll_lite.cli",
        "--config",
        str(REPO / "configs/code.yaml"),
        f"sft.steps={sft_steps}",
        f"steps={steps}",
        f"eval_every={steps}",
        "save_model=false",
        "checkpoint.enabled=false",
        f"output_dir={out}",
        "run_name=code",
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"roll-train failed:\n{done.stderr[-2000:]}")
    records = [json.loads(line) for line in (out / "code" / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in records if "perf/reward_s" in r][1:]
    evals = [r["eval/reward_mean"] for r in records if "eval/reward_mean" in r]
    return (
        statistics.median(r["perf/reward_s"] for r in timed),
        statistics.median(r["perf/step_s"] for r in timed),
        evals[-1],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--programs", type=int, default=128)
    parser.add_argument("--sft-steps", type=int, default=300, help="the warm start (configs/code.yaml's)")
    parser.add_argument("--steps", type=int, default=10, help="RL steps of the step table; 0: no step table")
    parser.add_argument("--smoke", action="store_true", help="3 repeats, 8 programs, no roll-train run")
    args = parser.parse_args()
    if args.smoke:
        args.repeats, args.programs, args.steps = 3, 8, 0
    print(f"\none run of print(1), median of {args.repeats} ({PYTHON})\n")
    print("| layers | ms per run |\n|---|---|")
    for name, ms in layers(args.repeats):
        print(f"| {name} | {ms:.1f} |")
    print(f"\n{args.programs} programs through SandboxPool, each judged (isolation=bwrap)\n")
    print("| programs | workers | programs/s |\n|---|---|---|")
    for name, workers, speed in throughput(args.programs):
        print(f"| {name} | {workers} | {speed:.1f} |")
    if args.steps:
        with tempfile.TemporaryDirectory() as tmp:
            reward_s, step_s, held_out = step_share(args.sft_steps, args.steps, Path(tmp))
        print(
            f"\nroll-train --config configs/code.yaml sft.steps={args.sft_steps} steps={args.steps}, median after the first\n"
        )
        print("| reward s | step s | reward share of the step | held-out pass rate at the end |\n|---|---|---|---|")
        print(f"| {reward_s:.3f} | {step_s:.3f} | {reward_s / step_s:.0%} | {held_out:.3f} |")


if __name__ == "__main__":
    main()
