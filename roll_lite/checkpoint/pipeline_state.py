"""What a PPO pipeline's checkpoint holds, part by part, and how it is put back.

    actor/, critic/      model + optimizer shards (DCP), LR schedule, each rank's random generators
    reference/           the reference's weights (it holds the policy of the warm start, not the build)
    rng_rollout.pkl      the rollout engine's sampling position and its process's random generators
    rng_driver.pkl       the driver's generators and the mini-batch shuffle's torch.Generator
    checkpoint.json      the step, the prompt sampler's position, the parts (written last)
"""

from __future__ import annotations

import json
from pathlib import Path

from roll_lite.checkpoint.errors import CheckpointError
from roll_lite.checkpoint.layout import MARKER
from roll_lite.checkpoint.rng import load_rng, save_rng

FORMAT = 1


def model_groups(pipeline) -> dict:
    groups = {"actor": pipeline.actor, "critic": pipeline.critic, "reference": pipeline.reference}
    return {name: group for name, group in groups.items() if group is not None}


def save_pipeline_state(pipeline, folder: Path, step: int) -> dict:
    """Write every part into `folder`; returns the manifest (checkpoint.json's content)."""
    groups = model_groups(pipeline)
    for name, group in groups.items():
        group.save_checkpoint(str(folder / name))
    pipeline.rollout.save_checkpoint(str(folder / "rng_rollout.pkl"))
    save_rng(folder / "rng_driver.pkl", {"minibatch_shuffle": pipeline._shuffle.get_state()})
    return {"format": FORMAT, "step": step, "sampler": pipeline.sampler.state_dict(), "parts": sorted(groups)}


def read_manifest(folder: Path) -> dict:
    return json.loads((folder / MARKER).read_text())


def load_pipeline_state(pipeline, folder: Path) -> int:
    """Put every part back (workers started, nothing else done yet); returns the checkpoint's step."""
    manifest = read_manifest(folder)
    groups = model_groups(pipeline)
    if sorted(groups) != manifest["parts"]:
        raise CheckpointError(f"resume: {folder} holds {', '.join(manifest['parts'])}; this run has "
                              f"{', '.join(sorted(groups))} (algorithm.advantage, algorithm.kl_coef / track_kl differ)")
    for name, group in groups.items():
        try:
            group.load_checkpoint(str(folder / name))
        except Exception as error:  # noqa: BLE001 - e.g. another model shape: one line naming the part
            cause = getattr(error, "cause", None) or error
            first_line = (str(cause).strip().splitlines() or [type(cause).__name__])[-1][:300]
            raise CheckpointError(f"resume: {folder / name} does not load into this run's {name}: {first_line}") from None
    step = manifest["step"]
    pipeline.rollout.update_weights(pipeline.actor.state_dict_ref(), version=step)
    pipeline.rollout.load_checkpoint(str(folder / "rng_rollout.pkl"))
    pipeline.sampler.load_state_dict(manifest["sampler"])
    pipeline._shuffle.set_state(load_rng(folder / "rng_driver.pkl")["minibatch_shuffle"])
    return step
