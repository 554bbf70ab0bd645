"""One run directory, one run at a time: a lock, and the choice between a fresh start, a resume
and a refusal, made before anything in the directory changes.

The lock is an flock on <run_dir>/.lock held for the life of the driver process: the kernel drops
it when the process ends, SIGKILL included, so a killed run never leaves a stale lock. (flock is
local to one machine; on a network filesystem two drivers on two machines may both get it.)
"""

from __future__ import annotations

import fcntl
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from roll_lite.checkpoint import layout
from roll_lite.checkpoint.errors import CheckpointError

LOCK = ".lock"


@dataclass
class RunDirClaim:
    path: Path
    resume_from: Path | None  # the checkpoint to continue from; None: a fresh run
    created: Path | None  # the outermost folder this claim made: the run directory, or output_dir above it
    lock_file: IO

    def release(self) -> None:
        """Drop the lock; a directory this claim created and nothing was written to is removed, with
        the folders above it that the claim made (output_dir) while they are empty."""
        if self.lock_file.closed:
            return
        if self.created is not None and not _contents(self.path):
            shutil.rmtree(self.path, ignore_errors=True)
            folder = self.path
            while folder != self.created:
                folder = folder.parent
                try:
                    folder.rmdir()  # only an empty one: another run may have started beside this one
                except OSError:
                    break
        self.lock_file.close()  # closing the file drops the flock


def claim_run_dir(run_dir: Path, resume: str) -> RunDirClaim:
    """Lock `run_dir` and decide what this run does with it; raises CheckpointError (one line) when
    another run holds it, or when it holds a run that `resume` does not continue."""
    run_dir = Path(run_dir)
    created = _outermost_missing(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lock_file = open(run_dir / LOCK, "a+")
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock_file.seek(0)
        holder = lock_file.read().strip() or "?"
        lock_file.close()
        raise CheckpointError(
            f"run_name: {run_dir} is in use by another run (pid {holder}); wait for it to end "
            "or choose another run_name="
        ) from None
    lock_file.truncate(0)
    lock_file.write(str(os.getpid()))
    lock_file.flush()
    claim = RunDirClaim(run_dir, None, created, lock_file)
    try:
        claim.resume_from = _checkpoint_to_resume(run_dir, resume)
    except BaseException:
        claim.release()
        raise
    return claim


def _outermost_missing(path: Path) -> Path | None:
    """The outermost of `path` and the folders above it that does not exist; None when `path` exists."""
    missing = None
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing = folder
    return missing


def _contents(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.iterdir() if p.name != LOCK) if run_dir.is_dir() else []


def _checkpoint_to_resume(run_dir: Path, resume: str) -> Path | None:
    contents = _contents(run_dir)
    held = f"{run_dir} already holds a run ({', '.join(contents)})"
    if resume == "none":
        if contents:
            raise CheckpointError(
                f"resume=none: {held}; resume=auto continues it from its latest checkpoint, or "
                "choose another run_name= (nothing was changed)"
            )
        return None
    if resume == "auto":
        checkpoint = layout.latest(run_dir)
        if checkpoint is None and contents:
            raise CheckpointError(
                f"resume=auto: {held} but no checkpoint to resume from; choose another run_name=, "
                "or resume=PATH of a checkpoint (nothing was changed)"
            )
        return checkpoint
    checkpoint = resolve_checkpoint(Path(resume))
    inside = checkpoint.resolve().is_relative_to(layout.checkpoints_dir(run_dir).resolve())
    if contents and not inside:
        raise CheckpointError(
            f"resume={resume}: {held}; resume another run's checkpoint into a new run_name= (nothing was changed)"
        )
    return checkpoint


def finished_checkpoint(run_dir: Path, resume: str, total_steps: int, needs_final: bool) -> Path | None:
    """The checkpoint `resume` would continue `run_dir` from, when that is this run's own checkpoint
    of step >= `total_steps` and (with `needs_final`) its final/ is written: a finished run, nothing to
    train. None otherwise, also when `resume` is refused (claim_run_dir says why). Reads only."""
    run_dir = Path(run_dir)
    if resume == "none" or not run_dir.is_dir():
        return None
    try:
        checkpoint = _checkpoint_to_resume(run_dir, resume)
    except CheckpointError:
        return None
    if checkpoint is None or not checkpoint.resolve().is_relative_to(layout.checkpoints_dir(run_dir).resolve()):
        return None
    from roll_lite.checkpoint.pipeline_state import read_manifest

    step = read_manifest(checkpoint).get("step", 0)
    if step < total_steps or (needs_final and not (run_dir / "final").is_dir()):
        return None
    return checkpoint


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint folder, or a run directory (its latest checkpoint)."""
    if not path.exists():
        raise CheckpointError(f"resume: no such checkpoint folder '{path}'")
    if layout.is_checkpoint(path):
        return path
    latest = layout.latest(path)
    if latest is not None:
        return latest
    raise CheckpointError(
        f"resume: '{path}' is not a checkpoint (no {layout.MARKER}) nor a run directory with one; "
        "give a checkpoints/step_N folder"
    )


def read_history(checkpoint: Path) -> list[dict]:
    """The metrics records a checkpoint holds (steps 0..its step)."""
    import json

    return [json.loads(line) for line in (checkpoint / "metrics.jsonl").read_text().splitlines() if line.strip()]


def discard_after(run_dir: Path, step: int, trains_on: bool) -> list[str]:
    """Before continuing from `step`: what the run directory holds from later (checkpoints of an
    abandoned trajectory; when training goes on, the final policy of an earlier end) is removed;
    returns what, for the log."""
    removed = []
    for later in [s for s in layout.committed_steps(run_dir) if s > step]:
        shutil.rmtree(layout.step_dir(run_dir, later))
        removed.append(f"checkpoints/step_{later}")
    if trains_on and (run_dir / "final").exists():
        shutil.rmtree(run_dir / "final")
        removed.append("final/")
    layout.remove_partials(run_dir)
    return removed
