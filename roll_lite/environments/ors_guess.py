"""guess_the_number as an Open Reward Standard environment (the openreward SDK's Environment, tool and Server):
the same game, observations and rewards as roll_lite.environments.guess_the_number, played with the `ors`
environment. A task is {"secret": n}; the model's reply goes to the tool `guess`. make_server's defaults are
configs/multiturn.yaml's game, so its rewards compare with that config's.

    python -c "from roll_lite.environments.ors_guess import make_server; make_server().run('127.0.0.1', 8080)"
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENREWARD_LOG_LEVEL", "WARNING")  # read as openreward's loggers are made, at import
os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")

from openreward.environments import Environment, Server, TextBlock, ToolOutput, tool  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from roll_lite.environments.guess_the_number import GuessTheNumber  # noqa: E402

GAME: dict = {"lo": 1, "hi": 16, "max_turns": 5, "intro": "Guess {lo}-{hi}."}


class Guess(BaseModel):
    text: str


class GuessTheNumberEnv(Environment):
    """ORS name: guessthenumberenv. Splits train and test: a task per secret of [lo, hi]."""

    game: dict = GAME

    def __init__(self, task_spec={}, secrets={}):  # noqa: B006  (the SDK's own signature)
        super().__init__(task_spec, secrets)
        self.play = GuessTheNumber(**self.game)
        self.prompt, _ = self.play.reset(secret=int(task_spec["secret"]))

    @classmethod
    def list_splits(cls):
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str):
        return [{"secret": secret} for secret in range(cls.game["lo"], cls.game["hi"] + 1)]

    def get_prompt(self):
        return [TextBlock(text=self.prompt)]

    @tool
    async def guess(self, args: Guess) -> ToolOutput:
        """Guess the number."""
        text, reward, terminated, truncated, info = self.play.step(args.text)
        metadata = {**info, "truncated": truncated}  # the ors environment reads it as a cut
        return ToolOutput(
            blocks=[TextBlock(text=text)], reward=reward, finished=terminated or truncated, metadata=metadata
        )


def make_server(**game) -> Server:
    """The ORS server hosting the game (GAME by default, or `game`'s lo / hi / max_turns / intro)."""
    environment = type("GuessTheNumberEnv", (GuessTheNumberEnv,), {"game": {**GAME, **game}})
    return Server([environment])
