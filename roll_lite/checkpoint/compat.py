"""Does a checkpoint fit this run? Checked in the driver, from the checkpoint's config.yaml, before
Ray starts: the keys that decide the shapes of the saved tensors and which prompts the sampler's
position refers to. (Anything these keys miss, e.g. another model behind the same pretrained_path,
still fails at load time with one line naming the part.)"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from roll_lite.checkpoint.errors import CheckpointError
from roll_lite.checkpoint.pipeline_state import checkpoint_kind, read_manifest
from roll_lite.config import RunConfig

# The keys every pipeline's checkpoint must match; a pipeline adds its own (checkpoint_compat_keys:
# those that decide which rows its sampler's position refers to).
MODEL_KEYS = (
    "model.model_type",
    "model.hidden_size",
    "model.intermediate_size",
    "model.num_hidden_layers",
    "model.num_attention_heads",
    "model.num_key_value_heads",
    "model.tie_word_embeddings",
    "model.dtype",
    "model.tokenizer_path",
)


def check_compatible(checkpoint: Path, config: RunConfig, pipeline_kind: str, pipeline_keys: tuple[str, ...]) -> None:
    """`pipeline_kind`: what the run's pipeline writes ("rl", "sft"); `pipeline_keys`: its keys besides MODEL_KEYS."""
    kind = checkpoint_kind(read_manifest(checkpoint))
    if kind != pipeline_kind:
        raise CheckpointError(
            f"resume: {checkpoint} is a checkpoint of an {kind.upper()} run; this run's pipeline "
            f"({config.pipeline}) resumes {pipeline_kind.upper()} checkpoints. To start from that "
            "run's model, give its final/ as model.pretrained_path= with a new run_name="
        )
    saved_file = checkpoint / "config.yaml"
    try:
        saved = OmegaConf.load(saved_file)
    except Exception as error:  # noqa: BLE001 - any unreadable file is the same one-line error
        raise CheckpointError(f"resume: {saved_file} cannot be read ({type(error).__name__})") from None
    current = OmegaConf.structured(config)
    for key in MODEL_KEYS + tuple(pipeline_keys):
        before, now = OmegaConf.select(saved, key), OmegaConf.select(current, key)
        if before != now:
            raise CheckpointError(
                f"resume: {checkpoint} was written with {key}={_show(before)}, this run has "
                f"{key}={_show(now)}; resume with the same {key} or start a new run_name="
            )
    data_seed = lambda c: c.seed if c.data.seed is None else c.data.seed  # noqa: E731
    if data_seed(saved) != data_seed(current):
        raise CheckpointError(
            f"resume: {checkpoint} was written with data seed {data_seed(saved)} (data.seed, else "
            f"seed), this run has {data_seed(current)}"
        )


def _show(value) -> str:
    return str(OmegaConf.to_container(value) if OmegaConf.is_config(value) else value)
