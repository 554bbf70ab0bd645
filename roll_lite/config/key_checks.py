"""The checks that validation is made of, one key at a time: each failure is a ConfigError naming the key."""

from __future__ import annotations

from typing import Any, Collection

from roll_lite.errors import ConfigError


def check(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{key}: {message}")


def one_of(value: Any, allowed: Collection[Any], key: str) -> None:
    check(value in allowed, key, f"'{value}' is not one of {', '.join(map(str, allowed))}")


def file_list(value: Any, key: str) -> list[str]:
    if value is None:
        return []
    files = [value] if isinstance(value, str) else value
    check(
        isinstance(files, list) and all(isinstance(f, str) and f for f in files),
        key,
        f"must be a path or a list of paths, got {value!r}",
    )
    return list(files)
