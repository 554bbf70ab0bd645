"""Checking the reward section in the driver, before anything starts: each function a registered
name, or an import path that imports to a function taking (response, ground_truth, extra); each
reward model and judge a folder of the right kind; each weight a finite number; with reward.domains,
every domain's sources. Errors are one line naming the key (ValueError)."""

from __future__ import annotations

import inspect
import math

from roll_lite.rewards.registry import REWARD_FUNCTIONS, is_import_path, resolve_reward


def check_reward_config(reward) -> None:
    """The reward section (a RewardConfig): every route's sources (the section's own, or each of
    reward.domains'), their weights, folders and templates, and the timeout."""
    from roll_lite.rewards.routing import routes

    if not reward.timeout_s > 0:
        raise ValueError(f"reward.timeout_s: must be > 0, got {reward.timeout_s}")
    if reward.domains and (reward.models or reward.judges or reward.code):
        key = "reward.models" if reward.models else "reward.judges" if reward.judges else "reward.code"
        raise ValueError(
            f"{key}: with reward.domains every source belongs to a domain; set "
            f"reward.domains.<domain>.{key.split('.')[1]} instead"
        )
    for domain, sources in routes(reward).items():
        prefix = "reward." if domain is None else f"reward.domains.{domain}."
        if not (sources.functions or sources.models or sources.judges or sources.code):
            raise ValueError(
                f"{prefix}functions: name at least one reward function (or a reward model, judge or the "
                f"code sandbox: {prefix}models, {prefix}judges, {prefix}code)"
            )
        if not isinstance(sources.code, (int, float)) or isinstance(sources.code, bool) or sources.code < 0:
            raise ValueError(
                f"{prefix}code: the code source's weight, a number >= 0 (0: not used), got {sources.code!r}"
            )
        check_functions(sources.functions, prefix + "functions")
        check_reward_models(sources.models, prefix + "models")
        if sources.judges:
            check_judges(sources.judges, reward.judge_template, reward.judge_parser, prefix + "judges")


def check_functions(functions: dict, section: str = "reward.functions") -> None:
    for name, weight in functions.items():
        key = f"{section}.{name}"
        if isinstance(weight, dict):  # `reward.functions.pkg.module:fn=1` was split at its dots
            spec, weight = _dotted(name, weight)
            raise ValueError(
                f"{key}: the weight must be a finite number, got a mapping; an import path as a key "
                f"needs the braces: {section}={{{spec}: {weight}}}"
            )
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ValueError(f"{key}: the weight must be a finite number, got {weight!r}")
        if not is_import_path(name):
            if name not in REWARD_FUNCTIONS:
                raise ValueError(
                    f"{key}: '{name}' is not one of {', '.join(sorted(REWARD_FUNCTIONS))}, "
                    "nor a package.module:function import path"
                )
            continue
        try:
            fn = resolve_reward(name, search_cwd=True)  # like `python -m`, after the installed packages
        except Exception as error:  # not found, not a function, or the module raised while importing
            message = (str(error).strip().splitlines() or [""])[0]
            if f"'{name}'" not in message:
                message = f"cannot import '{name}': {type(error).__name__}: {message}"
            raise ValueError(f"{key}: {message}") from None
        check_signature(key, fn)


def check_signature(key: str, fn) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to inspect (some builtins): called as it is
        return
    try:
        signature.bind("response", "ground truth", {})
    except TypeError:
        raise ValueError(f"{key}: must take (response, ground_truth, extra), its signature is {signature}") from None


def _dotted(prefix: str, nested: dict) -> tuple[str, object]:
    key, value = next(iter(nested.items()))
    return _dotted(f"{prefix}.{key}", value) if isinstance(value, dict) else (f"{prefix}.{key}", value)


def check_reward_models(models: dict, section: str = "reward.models") -> None:
    """reward.models: local folders of one-label sequence-classification models (reward/model:<folder>)."""
    from roll_lite.rewards.reward_model import check_reward_model_folder, model_metric_name

    _check_model_folders(models, section, check_reward_model_folder, model_metric_name)


def check_judges(judges: dict, template: str, parser: str | None, section: str = "reward.judges") -> None:
    """reward.judges: a template that parses and whose fields a row has; local folders of generative
    models (reward/judge:<folder>); a parser that imports."""
    from roll_lite.rewards.judge import check_judge_folder, judge_metric_name, template_source

    template_source(template)  # text alone: before the folders' models and tokenizers are read
    _check_model_folders(judges, section, check_judge_folder, judge_metric_name)
    if parser is not None:
        if not is_import_path(parser):
            raise ValueError(f"reward.judge_parser: '{parser}' is not a package.module:function import path")
        try:
            resolve_reward(parser, search_cwd=True)
        except Exception as error:
            raise ValueError(
                f"reward.judge_parser: cannot import '{parser}': {type(error).__name__}: {error}"
            ) from None


def _check_model_folders(sources: dict, section: str, check_folder, metric_name) -> None:
    """Finite weights, folders that `check_folder` accepts, and folder names that tell their metrics apart."""
    names: dict[str, str] = {}
    for path, weight in sources.items():
        key = f"{section}.{path}"
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ValueError(f"{key}: the weight must be a finite number, got {weight!r}")
        check_folder(path, key)
        name = metric_name(path)
        if name in names:
            raise ValueError(
                f"{section}: '{names[name]}' and '{path}' share the metric name {name!r} (from their folder names); "
                "rename one folder"
            )
        names[name] = path
