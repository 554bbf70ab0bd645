"""Rewards: built-in functions by name, the user's own by import path, and a runner that calls them
on a batch so that one raising or hanging call gives that response 0 and the run goes on.

`reward.functions: {exact_answer: 1.0, my_pkg.rewards:score: 0.5}` weights them; every function is
called as fn(response, ground_truth, extra) -> float (registry.py).
"""

from roll_lite.rewards import math_verify_reward, reasoning_gym_reward, rules  # noqa: F401  (they register the built-ins)
from roll_lite.rewards.registry import (
    CHEAP_REWARDS,
    REWARD_FUNCTIONS,
    RewardFn,
    get_reward,
    is_cheap,
    is_import_path,
    register_reward,
    resolve_reward,
)

__all__ = [
    "CHEAP_REWARDS",
    "REWARD_FUNCTIONS",
    "RewardFn",
    "get_reward",
    "is_cheap",
    "is_import_path",
    "register_reward",
    "resolve_reward",
]
