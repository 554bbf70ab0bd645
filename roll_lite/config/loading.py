"""Defaults <- a YAML file <- key=value overrides, merged with omegaconf, then validated."""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, Sequence

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from roll_lite.config.backend import resolve_backend
from roll_lite.config.node_labels import labels_of, pinned_apart
from roll_lite.config.schema import RunConfig
from roll_lite.config.validation import validate
from roll_lite.config.validation_rewards import rewards_needing_a_worker
from roll_lite.config.validation_rollout import in_actor_by_default
from roll_lite.errors import ConfigError


def _check_reward_weights(layer: Any, path: Path | None = None) -> None:
    """`reward.functions={exact_answer:1.0}` is YAML for {'exact_answer:1.0': null}: in a flow mapping a
    colon separates a key from its value only when a space follows it (import paths keep theirs:
    `my_pkg.rewards:score`). Say so, instead of omegaconf's "is not Optional"."""
    reward = layer.get("reward") if isinstance(layer, DictConfig) else None
    functions = reward.get("functions") if isinstance(reward, DictConfig) else None
    if not isinstance(functions, DictConfig):
        return
    entries = OmegaConf.to_container(functions)
    unweighted = [name for name, weight in entries.items() if weight is None]
    if not unweighted:
        return

    def written_right(name: str, weight: object) -> str:
        spec, _, tail = str(name).rpartition(":")
        if weight is None and spec:
            try:
                weight = float(tail) if tail.strip() else 1.0
                name = spec
            except ValueError:
                weight = 1.0
        return f"{name}: {1.0 if weight is None else weight}"

    fixed = "{" + ", ".join(written_right(name, weight) for name, weight in entries.items()) + "}"
    example = (
        f"functions: {fixed}"
        if path
        else f"reward.functions={fixed} (quote the override in the shell: 'reward.functions={fixed}')"
    )
    raise ConfigError(
        f"reward.functions: {', '.join(map(repr, unweighted))} {'has' if len(unweighted) == 1 else 'have'} "
        f"no weight{f' in {path}' if path else ''}: YAML flow mappings need a space after the colon, "
        f"e.g. {example}"
    )


def _replace_reward_functions(merged: Any, layer: Any) -> None:
    """A layer that sets reward.functions gives the whole set: replace, do not merge with the defaults."""
    reward = layer.get("reward") if isinstance(layer, DictConfig) else None
    functions = reward.get("functions") if isinstance(reward, DictConfig) else None
    if functions is not None:
        OmegaConf.update(merged, "reward.functions", functions, merge=False)


def load_config(
    path: str | Path | None = None, overrides: Sequence[str] = (), notes: list[str] | None = None
) -> RunConfig:
    """Defaults <- YAML file <- key=value overrides, validated; raises ConfigError. `notes` gets the lines
    saying what was chosen for the run (workers.backend=auto's choice), for the caller to log."""
    try:
        merged = OmegaConf.structured(RunConfig)  # each layer merges into it in place (OmegaConf.merge copies it)
        if path is not None:
            path = Path(path)
            if not path.is_file():
                raise ConfigError(f"--config: no such file '{path}'{_near_miss(path)}")
            layer = _load_yaml(path)
            _check_reward_weights(layer, path)
            merged.merge_with(layer)
            _replace_reward_functions(merged, layer)
        for override in overrides:
            if "=" not in override:
                raise ConfigError(f"override '{override}' is not of the form key=value")
        for override in overrides:  # in order: `reward.functions={...}` replaces, `reward.functions.NAME=w` sets one
            try:
                layer = OmegaConf.from_dotlist([override])
            except yaml.YAMLError as error:  # a value YAML cannot read, e.g. a leading `!` (a tag)
                key, _, value = override.partition("=")
                reason = str(error).splitlines()[0]
                raise ConfigError(f"{key.strip()}: YAML cannot read the value {value!r} ({reason}); quote it") from None
            _check_reward_weights(layer)
            merged.merge_with(layer)
            if override.partition("=")[0].strip() == "reward.functions":
                _replace_reward_functions(merged, layer)
        config: RunConfig = OmegaConf.to_object(merged)
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", None) or "config"
        message = str(error).splitlines()[0]
        raise ConfigError(f"{key}: {message}") from None
    _expand_home(config)
    # on CPU 1, or the actor's ranks when sequences are split (then the roles share the actor's processes)
    splits = config.actor.sequence_parallel > 1 or config.critic.sequence_parallel > 1
    for key in ("critic_dp", "reference_dp"):
        if getattr(config.workers, key) is None:
            setattr(config.workers, key, config.workers.actor_dp if config.workers.gpus_per_rank or splits else 1)
    if config.workers.one_process_per_rank is None:
        w = config.workers
        config.workers.one_process_per_rank = (
            w.reference_dp == w.actor_dp
            and w.critic_dp == w.actor_dp
            and not any(pinned_apart(config, role) for role in ("reference", "critic"))
        )
    if config.rollout.release_memory is None:
        config.rollout.release_memory = config.workers.rollout_gpus == 0 and config.workers.gpus_per_rank > 0
    if config.rollout.in_actor is None:
        config.rollout.in_actor = in_actor_by_default(config)
    if config.reward.in_driver is None:
        from roll_lite.rewards.routing import all_sources, reads_text, uses_code

        functions = all_sources(config.reward, "functions")
        config.reward.in_driver = not (
            rewards_needing_a_worker(functions)
            or reads_text(config.reward)
            or uses_code(config.reward)
            or bool(labels_of(config, "reward"))  # pinned to nodes: a reward worker there
        )
    try:
        validate(config)
    except ConfigError as error:
        raise ConfigError(_where_set(str(error), None if path is None else Path(path), overrides)) from None
    if (chosen := resolve_backend(config)) is not None and notes is not None:
        notes.append(chosen)
    if config.model.tokenizer_path is None:  # the tokenizer comes from the model's folder / hub id
        config.model.tokenizer_path = config.model.pretrained_path
    return config


def _expand_home(config: RunConfig) -> None:
    """A leading `~` in every path key means the home folder, as in a shell (configs/grpo_gsm8k.yaml
    names ~/data/gsm8k); a hub id never starts with one."""

    def expand(value: Any) -> Any:
        if isinstance(value, str):
            return os.path.expanduser(value) if value.startswith("~") else value
        return [expand(item) for item in value] if isinstance(value, list) else value

    for section, key in (
        ("data", "train_files"),
        ("data", "eval_files"),
        ("sft", "train_files"),
        ("sft", "eval_files"),
        ("preference", "train_files"),
        ("preference", "eval_files"),
        ("model", "pretrained_path"),
        ("model", "tokenizer_path"),
    ):
        setattr(getattr(config, section), key, expand(getattr(getattr(config, section), key)))
    config.distill.teacher = expand(config.distill.teacher)
    config.distill.teachers = {domain: expand(folder) for domain, folder in config.distill.teachers.items()}
    config.output_dir, config.resume = expand(config.output_dir), expand(config.resume)


# Keys whose value is a text of its own (a Jinja template), whose errors name a line of that text: the
# error also says where the value was set (the config file and its line, or an override).
_TEXT_KEYS = ("reward.judge_template",)


def _where_set(message: str, path: Path | None, overrides: Sequence[str]) -> str:
    """`message` ("key: ...") with where the key's value was set after the key, for the _TEXT_KEYS."""
    key, _, rest = message.partition(": ")
    if key not in _TEXT_KEYS:
        return message
    if any(override.partition("=")[0].strip() == key for override in overrides):
        return f"{key} (its key=value override): {rest}"
    line = _line_of(path, key) if path is not None else None
    return f"{key} ({path}:{line}): {rest}" if line is not None else message


def _line_of(path: Path, key: str) -> int | None:
    """The line of the YAML file `path` where dotted `key`'s value starts; None where it is not set."""
    try:
        node = yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (OSError, yaml.YAMLError):
        return None
    for part in key.split("."):
        if not isinstance(node, yaml.MappingNode):
            return None
        node = next((value for name, value in node.value if name.value == part), None)
    return None if node is None else node.start_mark.line + 1


def _near_miss(path: Path) -> str:
    """The end of --config's "no such file": the YAML file in `path`'s folder whose name, less its
    extension, is closest to `path`'s (configs/ppo.yml, configs/ppo, configs/grpo_asyn.yaml: "; did you
    mean 'configs/ppo.yaml'?"), or "" when none is close."""
    folder = path.parent
    files = sorted(p for p in folder.glob("*") if p.suffix in (".yaml", ".yml")) if folder.is_dir() else []
    close = difflib.get_close_matches(path.stem, [file.stem for file in files], 1)
    return f"; did you mean '{folder / next(f.name for f in files if f.stem == close[0])}'?" if close else ""


def _load_yaml(path: Path) -> Any:
    try:
        return OmegaConf.load(path)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"--config: {where}: YAML syntax error: {problem}") from None


def to_yaml(config: RunConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(config))
