"""The reward registry: built-in reward functions by name, and resolving a `reward.functions` key.

Every reward function has one signature, built-ins and the user's own alike:

    fn(response: str, ground_truth: str, extra: dict) -> float

`extra` holds the dataset row's other fields ({} when the data has none). A bool or int is taken as
a float; anything else, or a nan / inf, counts as a failed call (see runner.py).
"""

from __future__ import annotations

from typing import Callable

RewardFn = Callable[[str, str, dict], float]
REWARD_FUNCTIONS: dict[str, RewardFn] = {}
# Built-ins that are cheap, bounded and trusted run in the reward worker's own process; every other
# function (math, the user's) runs in a guarded subprocess with a per-call timeout.
CHEAP_REWARDS: set[str] = set()


def register_reward(name: str, cheap: bool = False):
    def register(fn: RewardFn) -> RewardFn:
        if name in REWARD_FUNCTIONS:
            raise ValueError(f"reward function '{name}' is already registered")
        REWARD_FUNCTIONS[name] = fn
        if cheap:
            CHEAP_REWARDS.add(name)
        return fn

    return register


def get_reward(name: str) -> RewardFn:
    if name not in REWARD_FUNCTIONS:
        raise KeyError(f"unknown reward function '{name}'; registered: {', '.join(sorted(REWARD_FUNCTIONS))}")
    return REWARD_FUNCTIONS[name]


def is_import_path(spec: str) -> bool:
    return ":" in spec


def resolve_reward(spec: str, search_cwd: bool = False) -> RewardFn:
    """A registered name, or a `package.module:function` import path (with `search_cwd`, found from the
    current directory after the installed packages, as roll_lite.runtime.importing.load_object does)."""
    if not is_import_path(spec):
        return get_reward(spec)
    from roll_lite.runtime.importing import load_object

    fn = load_object(spec, search_cwd=search_cwd)
    if not callable(fn):
        raise TypeError(f"'{spec}' is a {type(fn).__name__}, not a function")
    return fn


def is_cheap(spec: str) -> bool:
    return spec in CHEAP_REWARDS
