"""What a run's config changes against the config.yaml of the checkpoint it continues, and how a run
directory records the changes a resume made.

`changed_keys(saved, config)`: every key (a dataclass field of RunConfig; a dict-valued key such as
reward.functions is one key) whose value differs from the checkpoint's config.yaml. Where the run
directory is (run_name, output_dir) and which checkpoint continues it (resume) are not changes. A key
the saved config.yaml lacks (written before the key existed) is not compared.

A resume that changes keys records them: each checkpoint's checkpoint.json keeps the list of the
resumes that led to it (`config_changes`: [{"step": N, "changed": {key: [before, after]}}]), and
config.yaml (the run directory's and each checkpoint's) is the config of the latest segment, headed by
a comment naming what each resume changed, so that no value in it stands unannounced for steps it
did not train.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf

from roll_lite.checkpoint.errors import CheckpointError
from roll_lite.config import RunConfig, to_yaml

# Where the run is and what continues it: not what it does.
NOT_COMPARED = ("run_name", "output_dir", "resume")


@dataclass(frozen=True)
class ConfigChange:
    key: str
    before: object  # the checkpoint's config.yaml value
    after: object  # this run's

    def __str__(self) -> str:
        return f"{self.key}: {show(self.before)} -> {show(self.after)}"


def show(value) -> str:
    """A value as one would type it in an override."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, dict)):  # YAML's flow style, on one line: [a, b], {exact_answer: 1.0}
        return yaml.safe_dump(value, default_flow_style=True, width=float("inf")).strip()
    return str(value)


def saved_config(checkpoint: Path) -> DictConfig:
    """The config.yaml a checkpoint was written with; CheckpointError (one line) when it cannot be read."""
    path = Path(checkpoint) / "config.yaml"
    try:
        saved = OmegaConf.load(path)
    except Exception as error:  # noqa: BLE001 - any unreadable file is the same one-line error
        raise CheckpointError(f"resume: {path} cannot be read ({type(error).__name__})") from None
    if not isinstance(saved, DictConfig):
        raise CheckpointError(f"resume: {path} is not a mapping of config keys")
    return saved


def config_keys(section=RunConfig, prefix: str = "") -> list[str]:
    """Every key of RunConfig, dotted: the fields of its sections (dataclass defaults), recursively."""
    keys = []
    for field in dataclasses.fields(section):
        default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        if dataclasses.is_dataclass(default):
            keys += config_keys(type(default), f"{prefix}{field.name}.")
        else:
            keys.append(f"{prefix}{field.name}")
    return keys


def data_seed(config: DictConfig) -> object:
    """data.seed, else seed: the seed of the prompt order."""
    own = OmegaConf.select(config, "data.seed")
    return OmegaConf.select(config, "seed") if own is None else own


def changed_keys(saved: DictConfig, config: RunConfig) -> list[ConfigChange]:
    """This run's keys whose values differ from `saved` (a checkpoint's config.yaml), in RunConfig's order.
    A changed data.seed counts only when the prompt order's seed (data.seed, else seed) changes with it."""
    current = OmegaConf.create(to_yaml(config))  # the same YAML round trip as the saved one's
    missing = object()
    changes = []
    for key in config_keys():
        if key in NOT_COMPARED:
            continue
        before = OmegaConf.select(saved, key, default=missing)
        if before is missing:
            continue
        before, after = _plain(before), _plain(OmegaConf.select(current, key))
        if key == "data.seed" and data_seed(saved) == data_seed(current):
            continue  # e.g. null -> 0 with seed 0: the same prompt order
        if before != after:
            changes.append(ConfigChange(key, before, after))
    return changes


def _plain(value):
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


# -- the record of a run's resumes ------------------------------------------------------------------


def history_entry(step: int, changes: list[ConfigChange]) -> dict:
    """What a resume from `step` that made `changes` adds to the run's record (checkpoint.json's config_changes)."""
    return {"step": step, "changed": {c.key: [c.before, c.after] for c in changes}}


def config_yaml(config: RunConfig, history: list[dict]) -> str:
    """config.yaml's text: the config, headed by what each resume in `history` changed."""
    if not history:
        return to_yaml(config)
    lines = ["# Resumed with changed keys; the values below are those of the latest segment."]
    for entry in history:
        changed = [str(ConfigChange(key, before, after)) for key, (before, after) in entry["changed"].items()]
        lines.append(f"# Steps after {entry['step']}: {'; '.join(changed)}")
    return "\n".join(lines) + "\n" + to_yaml(config)
