"""Environments for multi-turn RL: the contract (contract.py), built-ins by name and the user's classes
by import path (registry.py), any of them with tools the model may call (tools.py), a runner that
steps many of them at once in guarded processes, a fault costing one trajectory (runner.py), and
trajectories built token in, token out (turns.py).

    environment: {name: guess_the_number, kwargs: {hi: 50}}     # or name: my_pkg.envs:MyEnv
"""

from roll_lite.environments import color_cards, gem_env, guess_the_number, openenv_env, ors_env, tools  # noqa: F401  (they register the built-ins)
from roll_lite.environments.config import EnvironmentConfig, check_environment_config
from roll_lite.environments.contract import BadReturn, Observation, Transition, checked_reset, checked_step
from roll_lite.environments.registry import ENVIRONMENTS, register_environment, resolve_environment
from roll_lite.environments.results import FAULTS, Result
from roll_lite.environments.runner import EnvironmentRunner
from roll_lite.environments.tools import ToolEnvironment

__all__ = [
    "ENVIRONMENTS",
    "FAULTS",
    "BadReturn",
    "EnvironmentConfig",
    "EnvironmentRunner",
    "Observation",
    "Result",
    "ToolEnvironment",
    "Transition",
    "check_environment_config",
    "checked_reset",
    "checked_step",
    "register_environment",
    "resolve_environment",
]
