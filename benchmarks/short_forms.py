"""Runs every short form of docs/getting-started.md ("Short runs") verbatim, as a user types it, and prints
what each showed: the steps whose reward and gradient were above 0, the feature's own metric at the first
and the last step (the step line's feature part), the held-out reward from start to end, and the wall and
CPU seconds of the command (every process it started: scripts/cpu_cgroup.py, where root can make a cgroup).

The commands run in a scratch directory that links the repository's files, so `outputs/` is the scratch
one and a user's own outputs are never touched. A command whose prerequisite folder is missing (the
mixed-domain run needs the reward model and the judge of docs/rewards.md) is reported with its error line;
`--with-prerequisites` first runs the commands docs/rewards.md gives for them (about 6 minutes).

    python benchmarks/short_forms.py [--only grpo.yaml,ppo.yaml] [--with-prerequisites]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]
from cpu_cgroup import CpuCgroup  # noqa: E402

from pipelines.run_log import feature_parts  # noqa: E402

COMMAND = re.compile(r"`(roll-train [^`]+)`")
PREREQUISITES = ("docs/rewards.md", "## A mixed-domain run on a CPU")


def section(path: Path, heading: str) -> str:
    text = path.read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end > 0 else len(text)]


def short_forms(docs: Path) -> list[tuple[str, str]]:
    """(config cell, command) of every row of the short-runs table that has a command; the last command of
    a cell is the short form (an earlier one names its prerequisite)."""
    rows = []
    for line in section(docs, "## Short runs").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0] or cells[0] in ("config", "---"):
            continue
        commands = COMMAND.findall(cells[1])
        if commands:
            rows.append((cells[0].strip("`"), commands[-1]))
    return rows


def prerequisite_commands() -> list[str]:
    block = section(REPO / PREREQUISITES[0], PREREQUISITES[1]).split("```bash", 1)[1].split("```", 1)[0]
    return [line for line in block.strip().splitlines() if line.startswith("roll-train") and "run_name=" in line]


def scratch_dir() -> Path:
    where = Path(tempfile.mkdtemp(prefix="short_forms_"))
    for entry in REPO.iterdir():
        if entry.name not in ("outputs", ".git"):
            (where / entry.name).symlink_to(entry)
    return where


def run(command: str, cwd: Path) -> tuple[int, str, float, float | None]:
    """(exit code, the last line it printed, wall s, CPU s of the command and every process it started, or
    None where no cgroup can be made: scripts/cpu_cgroup.py)."""
    with CpuCgroup("short_forms") as group:
        start = time.monotonic()
        done = subprocess.run(shlex.split(command), cwd=cwd, capture_output=True, text=True, preexec_fn=group.join)
        wall = time.monotonic() - start
        cpu = group.seconds()
    lines = (done.stdout + done.stderr).strip().splitlines() or [""]
    return done.returncode, lines[-1], wall, cpu


def seconds(wall: float, cpu: float | None) -> str:
    return f"{wall:.0f} / {cpu:.0f}" if cpu is not None else f"{wall:.0f} / ?"


def what_it_showed(run_dir: Path) -> dict:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "actor/grad_norm" in r]
    held_out = [r["eval/reward_mean"] for r in records if r.get("eval/reward_mean") is not None]
    return {
        "steps": len(steps),
        "reward_above_0": sum(1 for r in steps if r.get("reward/mean", 0) > 0),
        "grad_above_0": sum(1 for r in steps if r["actor/grad_norm"] > 0),
        "feature_first": ", ".join(feature_parts(steps[0])) if steps else "",
        "feature_last": ", ".join(feature_parts(steps[-1])) if steps else "",
        "held_out": f"{held_out[0]:.3f} -> {held_out[-1]:.3f}" if held_out else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated config cells, e.g. grpo.yaml,ppo.yaml")
    parser.add_argument("--with-prerequisites", action="store_true")
    args = parser.parse_args()
    rows = short_forms(REPO / "docs/getting-started.md")
    if args.only:
        rows = [row for row in rows if row[0] in args.only.split(",")]
    cwd = scratch_dir()
    env_note = f"scratch dir {cwd}; {os.cpu_count()} CPUs"
    print(env_note, file=sys.stderr)
    if args.with_prerequisites:
        for command in prerequisite_commands():
            code, last, wall, cpu = run(command, cwd)
            print(f"# prerequisite (wall / CPU s {seconds(wall, cpu)}, exit {code}): {command}", file=sys.stderr)
    print(
        "| config | exit | steps with reward > 0 | grad > 0 | feature at the first step -> the last | held-out | wall / CPU s |"
    )
    print("|---|---:|---:|---:|---|---|---|")
    for config, command in rows:
        code, last, wall, cpu = run(command, cwd)
        name = re.search(r"run_name=(\S+)", command)
        if code != 0 or name is None:
            print(f"| `{config}` | {code} | | | {last} | | {seconds(wall, cpu)} |")
            continue
        shown = what_it_showed(cwd / "outputs" / name.group(1))
        feature = f"{shown['feature_first']} -> {shown['feature_last']}"
        print(
            f"| `{config}` | 0 | {shown['reward_above_0']} of {shown['steps']} | {shown['grad_above_0']} | "
            f"{feature} | {shown['held_out']} | {seconds(wall, cpu)} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
