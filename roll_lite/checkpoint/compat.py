"""Does a checkpoint fit this run, and which of this run's changes may a resume make? Checked in the
driver, from the checkpoint's config.yaml, before Ray starts.

Every key this run changes against the checkpoint's config.yaml is either
- fixed (RESUME_FIXED, and the pipeline's own checkpoint_compat_keys): the checkpoint's state already
  went through the old value, or a resume would restore it, so the new one could not apply. A resume
  refuses the change with one line naming each such key with both values; nothing is written.
- or it applies from the resumed step on (steps, evaluation, logging, checkpoints, workers,
  micro-batching, rollout sampling, rewards, the loss's coefficients, the LR schedule's shape, ...):
  the session logs it and the run directory records it (config_changes.py).
(Anything the keys miss, e.g. another model behind the same pretrained_path, still fails at load
time with one line naming the part.)
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path
from typing import NamedTuple

from roll_lite.checkpoint.config_changes import ConfigChange, changed_keys, saved_config
from roll_lite.checkpoint.errors import CheckpointError
from roll_lite.checkpoint.pipeline_state import checkpoint_kind, read_manifest
from roll_lite.config import RunConfig

MODEL_KEYS = (
    "model.model_type",
    "model.hidden_size",
    "model.intermediate_size",
    "model.num_hidden_layers",
    "model.num_attention_heads",
    "model.num_key_value_heads",
    "model.max_position_embeddings",
    "model.tie_word_embeddings",
    "model.dtype",
    "model.pretrained_path",  # a resume loads the checkpoint's weights; with LoRA it rebuilds the frozen base from here
    "model.tokenizer_path",
    "model.trust_remote_code",
    "model.chat_template",
)
OPTIMIZER_KEYS = tuple(
    f"{role}.{name}"
    for role in ("actor", "critic")
    for name in ("lr", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps")
)
LORA_KEYS = tuple(f"{role}.lora.{name}" for role in ("actor", "critic") for name in ("rank", "alpha", "target_modules"))
RESTORED = "a resume restores them with the optimizer's state"


class Fixed(NamedTuple):
    reason: str  # why a resume cannot change them
    keys: tuple[str, ...]  # key patterns (fnmatch)
    kinds: tuple[str, ...] | None = None  # the checkpoint kinds the rule is for; None: every kind


RESUME_FIXED = (
    Fixed("the model its weights belong to", MODEL_KEYS),
    Fixed("its random generators and its prompt order were seeded with them", ("seed", "data.seed")),
    Fixed("its adapters' shapes and scale", LORA_KEYS),
    # torch's optimizer and LR scheduler state hold lr, betas, eps and weight decay, and a resume
    # restores them whatever the config says (measured: lr 1e-2 saved, 5e-4 configured, 1e-2 after the
    # load). The LR schedule's shape (warmup_steps, lr_schedule, total_steps) is rebuilt from the config.
    Fixed(RESTORED, OPTIMIZER_KEYS),
    Fixed(RESTORED, ("sft.lr",), kinds=("sft",)),
    Fixed(RESTORED, ("preference.lr",), kinds=("reward_model", "dpo")),
    Fixed("the warm start ran, or not, before step 1; a resume does not run it again", ("sft.*",), kinds=("rl",)),
    Fixed(
        "it holds the batches generated ahead of their steps under them",
        ("rollout.async_steps", "rollout.fully_async", "rollout.max_staleness"),
        kinds=("rl",),
    ),
)
PIPELINE_REASON = "what the pipeline's checkpoint holds depends on them (its data position, its models)"


def why_fixed(key: str, kind: str, pipeline_keys: tuple[str, ...]) -> str | None:
    """Why a resume of a `kind` checkpoint cannot change `key`, or None when it may."""
    for rule in RESUME_FIXED:
        if (rule.kinds is None or kind in rule.kinds) and any(fnmatchcase(key, p) for p in rule.keys):
            return rule.reason
    return PIPELINE_REASON if any(fnmatchcase(key, p) for p in pipeline_keys) else None


def check_compatible(
    checkpoint: Path, config: RunConfig, pipeline_kind: str, pipeline_keys: tuple[str, ...]
) -> list[ConfigChange]:
    """`pipeline_kind`: what the run's pipeline writes ("rl", "sft", ...); `pipeline_keys`: its own fixed
    keys (checkpoint_compat_keys). Returns this run's changes, all of keys a resume may change; raises
    CheckpointError naming every change it may not make."""
    kind = checkpoint_kind(read_manifest(checkpoint))
    if kind != pipeline_kind:
        raise CheckpointError(
            f"resume: {checkpoint} is a checkpoint of an {kind.upper()} run; this run's pipeline "
            f"({config.pipeline}) resumes {pipeline_kind.upper()} checkpoints. To start from that "
            "run's model, give its final/ as model.pretrained_path= with a new run_name="
        )
    changes = changed_keys(saved_config(checkpoint), config)
    refused: dict[str, list[ConfigChange]] = {}
    for change in changes:
        if (reason := why_fixed(change.key, kind, pipeline_keys)) is not None:
            refused.setdefault(reason, []).append(change)
    if refused:
        named = "; ".join(f"{', '.join(map(str, group))} ({reason})" for reason, group in refused.items())
        raise CheckpointError(
            f"resume: {checkpoint} was trained with other values of keys a resume cannot change: {named}. "
            "Resume with the checkpoint's values, or start a new run_name= (nothing was changed)"
        )
    return changes
