"""Where checkpoints live in a run directory, and how one is committed.

    <run_dir>/checkpoints/step_N/      a complete checkpoint (the rename below is its commit)
    <run_dir>/checkpoints/latest       a text file naming the newest one: "step_N"
    <run_dir>/checkpoints/.step_N.partial/   being written; never read, removed by the next save

A checkpoint is written into `.step_N.partial`, renamed to `step_N` once every part is there, and
only then does `latest` move to it (written to a temporary file and renamed over the old one). A
process killed at any point leaves `latest` naming a complete checkpoint, or no `latest` at all.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

LATEST = "latest"
MARKER = "checkpoint.json"  # in every checkpoint folder: what makes a folder a checkpoint
_STEP = re.compile(r"step_(\d+)")


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_dir(run_dir: Path, step: int) -> Path:
    return checkpoints_dir(run_dir) / f"step_{step}"


def partial_dir(run_dir: Path, step: int) -> Path:
    return checkpoints_dir(run_dir) / f".step_{step}.partial"


def is_checkpoint(folder: Path) -> bool:
    return (Path(folder) / MARKER).is_file()


def latest(run_dir: Path) -> Path | None:
    """The checkpoint `latest` names, or None when there is none yet."""
    pointer = checkpoints_dir(run_dir) / LATEST
    if not pointer.is_file():
        return None
    folder = checkpoints_dir(run_dir) / pointer.read_text().strip()
    return folder if is_checkpoint(folder) else None


def committed_steps(run_dir: Path) -> list[int]:
    """Steps of the complete checkpoints (step_N folders), ascending."""
    folder = checkpoints_dir(run_dir)
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _STEP.fullmatch(p.name)) and is_checkpoint(p))


def commit(partial: Path, target: Path) -> None:
    """Rename the finished `partial` folder to `target` and point `latest` at it."""
    _fsync_tree(partial)
    if target.exists():  # a leftover of an abandoned trajectory (resumed from an earlier step)
        shutil.rmtree(target)
    partial.rename(target)
    pointer = target.parent / LATEST
    temporary = target.parent / f".{LATEST}.tmp"
    temporary.write_text(target.name + "\n")
    os.replace(temporary, pointer)
    _fsync_dir(target.parent)


def prune(run_dir: Path, keep_last: int | None) -> list[int]:
    """Delete all but the `keep_last` newest checkpoints (never the one `latest` names); returns the
    deleted steps."""
    if keep_last is None:
        return []
    current = latest(run_dir)
    doomed = [s for s in committed_steps(run_dir)[:-keep_last] if step_dir(run_dir, s) != current]
    for step in doomed:
        shutil.rmtree(step_dir(run_dir, step))
    return doomed


def remove_partials(run_dir: Path) -> None:
    """Folders left by a write that was killed before its commit."""
    folder = checkpoints_dir(run_dir)
    if folder.is_dir():
        for path in folder.glob(".step_*.partial"):
            shutil.rmtree(path, ignore_errors=True)


def _fsync_tree(folder: Path) -> None:
    """Data on disk before the rename makes the checkpoint visible (a power loss, not only a kill)."""
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
