"""The multi-turn demo's data (configs/multiturn.yaml): guess-the-number rows and the conversations of
a demonstrator, as JSONL files.

- train.jsonl, eval.jsonl: one row per episode, `{"secret": n}`: the environment's reset takes the
  row's secret (roll_lite/environments/guess_the_number.py). Eval holds every secret of [lo, hi]
  once, so its success rate is over the whole task; training rows draw secrets uniformly.
- sft.jsonl: `{"messages": [...]}`: whole conversations played by a demonstrator that guesses
  uniformly at random among the numbers the hints so far allow. It never repeats a ruled-out number,
  but it does not bisect: it needs ~30% more guesses than bisection and runs out of turns now and
  then, which leaves RL something to improve (success, and turns to solve). Its observations are the
  environment's own, replayed on an instance of it.
- sft_tools.jsonl: the same game inside the `tools` environment with the calculator (configs/multiturn_tools.yaml):
  the tools' system message first, then a demonstrator that, for each guess, half the time asks the
  calculator for the middle of the numbers still possible and guesses its answer (bisection, through
  the tool), and otherwise guesses at random among them as above. Replayed on the tools environment,
  tool messages included.

Regenerate the files, byte for byte, with

    python -m roll_lite.environments.guess_the_number_data data/guess_the_number
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from roll_lite.environments.guess_the_number import GuessTheNumber
from roll_lite.environments.tools import ToolEnvironment

LO, HI, MAX_TURNS = 1, 16, 5
INTRO = "Guess {lo}-{hi}."  # configs/multiturn.yaml's environment.kwargs.intro: short, for a small model
NUM_TRAIN, NUM_SFT, SEED = 4096, 2048, 0
TOOLS, NUM_SFT_TOOLS = ["roll_lite.environments.example_tools:calculator"], 512  # configs/multiturn_tools.yaml


def demonstration(
    secret: int, rng: random.Random, lo: int = LO, hi: int = HI, max_turns: int = MAX_TURNS
) -> list[dict]:
    """One conversation: the environment's observations as user turns, the demonstrator's guesses as
    assistant turns, up to the environment's last observation (not included: the model never answers it)."""
    env = GuessTheNumber(lo=lo, hi=hi, max_turns=max_turns, intro=INTRO)
    observation, _ = env.reset(secret=secret)
    messages = [{"role": "user", "content": observation}]
    low, high = lo, hi
    while True:
        guess = rng.randint(low, high)
        messages.append({"role": "assistant", "content": str(guess)})
        observation, _, terminated, truncated, _ = env.step(str(guess))
        if terminated or truncated:
            return messages
        messages.append({"role": "user", "content": observation})
        low, high = (guess + 1, high) if guess < secret else (low, guess - 1)


def tool_demonstration(
    secret: int, rng: random.Random, lo: int = LO, hi: int = HI, max_turns: int = MAX_TURNS
) -> list[dict]:
    """One conversation of the game with the calculator (sft_tools.jsonl), up to the environment's last
    observation: the tools' system message and the game's intro, then the demonstrator's turns."""
    env = ToolEnvironment(
        env="guess_the_number", tools=TOOLS, env_kwargs={"lo": lo, "hi": hi, "max_turns": max_turns, "intro": INTRO}
    )
    messages, _ = env.reset(secret=secret)
    low, high = lo, hi
    while True:
        if rng.random() < 0.5:
            call = {"name": "calculator", "arguments": {"expression": f"({low}+{high})//2"}}
            reply = f"<tool_call>{json.dumps(call)}</tool_call>"
            messages.append({"role": "assistant", "content": reply})
            answers = env.step(reply)[0]
            messages += answers
            guess = int(answers[0]["content"])
        else:
            guess = rng.randint(low, high)
        messages.append({"role": "assistant", "content": str(guess)})
        observation, _, terminated, truncated, _ = env.step(str(guess))
        if terminated or truncated:
            return messages
        messages.append({"role": "user", "content": observation})
        low, high = (guess + 1, high) if guess < secret else (low, guess - 1)


def write(folder: Path) -> None:
    rng = random.Random(SEED)
    folder.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[dict[str, Any]]] = {
        "train.jsonl": [{"secret": rng.randint(LO, HI)} for _ in range(NUM_TRAIN)],
        "eval.jsonl": [{"secret": secret} for secret in range(LO, HI + 1)],
        "sft.jsonl": [{"messages": demonstration(rng.randint(LO, HI), rng)} for _ in range(NUM_SFT)],
    }
    rows["sft_tools.jsonl"] = [{"messages": tool_demonstration(rng.randint(LO, HI), rng)} for _ in range(NUM_SFT_TOOLS)]
    for name, lines in rows.items():
        (folder / name).write_text("".join(json.dumps(line) + "\n" for line in lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    write(parser.parse_args().folder)


if __name__ == "__main__":
    main()
