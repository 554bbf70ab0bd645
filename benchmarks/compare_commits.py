"""Step time of two commits, measured in the same run: an A/B for "did this change make a step slower?".

    python benchmarks/compare_commits.py OLD_REF [NEW_REF (default HEAD)] [--rounds 2] [--steps 40] [key=value ...]

Each commit is checked out into a temporary worktree and installed (--no-deps, editable) into a
virtual environment of its own that reuses this environment's packages, so both run the same torch,
Ray and transformers. The runs alternate (old, new, old, new, ...) so that a machine that speeds up or
slows down during the benchmark touches both. Each run is `roll-train --config configs/ppo.yaml
sft.steps=0 steps=N` of that commit on its own data files; without the warm start both sides train
the same freshly built model, so their responses (and so their work per step) stay comparable: the
table shows the mean response length to confirm it. The first 5 steps are left out of the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shared_venv import venv_sharing_packages

REPO = Path(__file__).resolve().parents[1]
PARTS = ("perf/step_s", "perf/generate_s", "perf/train_s", "perf/prepare_s", "perf/weight_sync_s")


def install(ref: str, where: Path) -> tuple[str, Path, Path]:
    """(short sha, worktree, python) of `ref`, installed into a venv that sees this one's packages."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short", ref], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()
    tree, venv = where / f"tree_{sha}", where / f"venv_{sha}"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], cwd=REPO, check=True, capture_output=True)
    python = venv_sharing_packages(venv)
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "-e", str(tree)], check=True)
    return sha, tree, python


def run(python: Path, tree: Path, out: Path, steps: int, overrides: list[str]) -> dict:
    data = tree / "data" / "reverse_digits"
    command = [
        str(python),
        "-m",
        "roll_lite.cli",
        "--config",
        str(tree / "configs/ppo.yaml"),
        "sft.steps=0",
        f"steps={steps}",
        f"eval_every={steps}",
        f"data.train_files={data / 'train.jsonl'}",
        f"data.eval_files={data / 'eval.jsonl'}",
        "save_model=false",
        f"output_dir={out}",
        "run_name=ab",
        *overrides,
    ]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=out.parent, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"{tree.name}: roll-train failed:\n{result.stderr[-3000:]}")
    records = [json.loads(line) for line in (out / "ab" / "metrics.jsonl").read_text().splitlines()]
    steps_measured = [r for r in records if "perf/step_s" in r][5:]
    row = {part: statistics.median(r[part] for r in steps_measured) for part in PARTS}
    row["response_length"] = statistics.mean(r["response_length/mean"] for r in steps_measured)
    row["wall_s"] = time.perf_counter() - start
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new", nargs="?", default="HEAD")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("overrides", nargs="*", help="key=value for both sides (keys both commits know)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="compare_commits_") as folder:
        where = Path(folder)
        sides = []
        try:
            for ref in (args.old, args.new):
                sides.append(install(ref, where))
            rows = []
            print(
                "| commit | round | median step | generate | train | prepare | weight sync | response length | wall |"
            )
            print("|---|---|---|---|---|---|---|---|---|")
            for round_ in range(1, args.rounds + 1):
                for sha, tree, python in sides:
                    out = where / f"out_{sha}_{round_}"
                    out.mkdir()
                    row = run(python, tree, out, args.steps, args.overrides)
                    rows.append((sha, row))
                    print(
                        f"| {sha} | {round_} | "
                        + " | ".join(f"{row[p]:.3f} s" for p in PARTS)
                        + f" | {row['response_length']:.2f} | {row['wall_s']:.0f} s |",
                        flush=True,
                    )
            (old, _, _), (new, _, _) = sides
            median = {sha: statistics.median(r["perf/step_s"] for s, r in rows if s == sha) for sha in (old, new)}
            print(f"\nmedian step, {new} / {old}: {median[new] / median[old]:.2f}")
        finally:
            for _, tree, _ in sides:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True)
            subprocess.run(["git", "worktree", "prune"], cwd=REPO, capture_output=True)  # a tree whose install failed


if __name__ == "__main__":
    main()
