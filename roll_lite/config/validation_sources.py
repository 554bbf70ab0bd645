"""data.source (roll_lite/data/sources.py): the keys' values, and the package's own task id and
arguments, checked by building one row before Ray starts; every error names the key."""

from __future__ import annotations

import json
from collections.abc import Mapping

from roll_lite.config.key_checks import check
from roll_lite.config.schema import DataConfig
from roll_lite.data.files import DataError
from roll_lite.errors import ConfigError
from roll_lite.rewards.reasoning_gym_reward import SOURCE_FIELDS


def validate_source(data: DataConfig) -> None:
    if data.source is None:
        return
    from roll_lite.data.sources import SOURCES, reasoning_gym_dataset

    check(
        data.source in SOURCES,
        "data.source",
        f"must be one of {', '.join(sorted(SOURCES))} or null, got {data.source!r}",
    )
    check(not data.train_files, "data.train_files", "must be empty with data.source (the rows come from the source)")
    check(not data.eval_files, "data.eval_files", "must be empty with data.source (use data.source_eval_size)")
    check(
        isinstance(data.source_task, str) and bool(data.source_task.strip()),
        "data.source_task",
        f"name the {data.source} task, got {data.source_task!r}",
    )
    check(
        isinstance(data.source_args, Mapping) and all(isinstance(key, str) for key in data.source_args),
        "data.source_args",
        f"must be a mapping of argument names to values, got {data.source_args!r}",
    )
    missing = [key for key in SOURCE_FIELDS if data.extra_keys is not None and key not in data.extra_keys]
    check(
        not missing,
        "data.extra_keys",
        f"must be null (every field) or include {', '.join(missing)} with data.source: the source's scorer "
        "rebuilds each row's entry from them",
    )
    for key in ("source_size", "source_eval_size"):
        value = getattr(data, key)
        least = 1 if key == "source_size" else 0
        check(
            isinstance(value, int) and not isinstance(value, bool) and value >= least,
            f"data.{key}",
            f"must be a whole number >= {least}, got {value!r}",
        )
    try:
        args_json = json.dumps(dict(data.source_args), sort_keys=True)
    except TypeError as error:
        raise ConfigError(f"data.source_args: must be plain values (numbers, strings, lists): {error}") from None
    try:  # the task id and its arguments, by the package itself: one row
        reasoning_gym_dataset(str(data.source_task), args_json, 0, 1)[0]
    except DataError as error:
        raise ConfigError(str(error)) from None
