"""guess_the_number served by OpenEnv (openenv-core's Environment, Action, Observation and create_app):
the same game, observations and rewards as roll_lite.environments.guess_the_number, played over HTTP /
WebSocket by the `openenv` environment. make_app's defaults are configs/multiturn.yaml's game, so its
rewards compare with that config's.

    python -m uvicorn roll_lite.environments.openenv_guess:make_app --factory --host 127.0.0.1 --port 8000
"""

from __future__ import annotations

from typing import Any, Optional

from openenv.core import Action, Environment, Observation, State, create_app
from pydantic import Field

from roll_lite.environments.guess_the_number import GuessTheNumber


class GuessAction(Action):
    text: str = Field(description="the model's reply")


class GuessObservation(Observation):
    text: str = Field(description="what the model sees next")
    truncated: bool = Field(default=False, description="out of guesses (done, not solved)")
    turn: int = 0
    outcome: str = ""


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True  # each session has its own game

    def __init__(self, **game_kwargs):
        super().__init__()
        self.game = GuessTheNumber(**game_kwargs)
        self._state = State(step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **row_fields: Any):
        fields = {key: row_fields[key] for key in ("secret", "lo", "hi") if key in row_fields}
        text, _ = self.game.reset(seed=seed, **fields)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(text=text)

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any):
        text, reward, terminated, truncated, info = self.game.step(action.text)
        self._state.step_count += 1
        return GuessObservation(
            text=text,
            reward=reward,
            done=terminated or truncated,
            truncated=truncated,
            turn=info["turn"],
            outcome=info["outcome"],
        )

    @property
    def state(self) -> State:
        return self._state


def make_app(lo: int = 1, hi: int = 16, max_turns: int = 5, intro: str = "Guess {lo}-{hi}.", max_sessions: int = 64):
    """The FastAPI app serving the game (configs/multiturn.yaml's by default)."""
    game = {"lo": lo, "hi": hi, "max_turns": max_turns, "intro": intro}
    return create_app(
        lambda: GuessEnvironment(**game),
        GuessAction,
        GuessObservation,
        "guess_the_number",
        max_concurrent_envs=max_sessions,
    )
