"""What a pipeline's checkpoint holds, part by part, and how it is put back.

<group>/             for each of the pipeline's checkpoint_groups() (PPO: actor, critic, reference;
                     SFT: actor): model + optimizer shards (DCP), LR schedule, each rank's generators
...                  whatever the pipeline's save_driver_state(folder) writes (PPO: the rollout
                     engine's sampling position and generators, the driver's generators)
checkpoint.json      the pipeline's checkpoint_kind ("rl", "sft"), the step, the sampler's position,
                     the groups (written last); after a resume that changed keys, the changes of
                     every resume that led to it (config_changes, roll_lite/checkpoint/config_changes.py)
"""

from __future__ import annotations

import json
from pathlib import Path

from roll_lite.checkpoint.errors import CheckpointError
from roll_lite.checkpoint.layout import MARKER

FORMAT = 1


def save_pipeline_state(pipeline, folder: Path, step: int) -> dict:
    """Write every part into `folder`; returns the manifest (checkpoint.json's content)."""
    groups = pipeline.checkpoint_groups()
    for name, group in groups.items():
        group.save_checkpoint(str(folder / name))
    pipeline.save_driver_state(folder)
    return {
        "format": FORMAT,
        "kind": pipeline.checkpoint_kind,
        "step": step,
        "sampler": pipeline.sampler.state_dict(),
        "parts": sorted(groups),
    }


def read_manifest(folder: Path) -> dict:
    try:
        return json.loads((folder / MARKER).read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"resume: {folder / MARKER} cannot be read ({type(error).__name__})") from None


def checkpoint_kind(manifest: dict) -> str:
    return manifest.get("kind", "rl")  # checkpoints written before SFT ones existed are all of RL runs


def load_pipeline_state(pipeline, folder: Path) -> int:
    """Put every part back (workers started, nothing else done yet); returns the checkpoint's step."""
    manifest = read_manifest(folder)
    groups = pipeline.checkpoint_groups()
    if sorted(groups) != manifest["parts"]:
        raise CheckpointError(
            f"resume: {folder} holds {', '.join(manifest['parts'])}; this run has "
            f"{', '.join(sorted(groups))} (another pipeline, or algorithm.advantage, algorithm.kl_coef / track_kl differ)"
        )
    for name, group in groups.items():
        try:
            group.load_checkpoint(str(folder / name))
        except Exception as error:  # noqa: BLE001 - e.g. another model shape: one line naming the part
            cause = getattr(error, "cause", None) or error
            first_line = (str(cause).strip().splitlines() or [type(cause).__name__])[-1][:300]
            raise CheckpointError(
                f"resume: {folder / name} does not load into this run's {name}: {first_line}"
            ) from None
    step = manifest["step"]
    pipeline.load_driver_state(folder, step)
    pipeline.sampler.load_state_dict(manifest["sampler"])
    return step
