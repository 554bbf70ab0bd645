"""`guess_the_number`: the environment thinks of a whole number in [lo, hi]; the model guesses, and hears
whether the number is higher or lower.

Built with `lo` (default 1), `hi` (default 100), `max_turns` (default 8; binary search needs
ceil(log2(hi - lo + 2)) guesses, 7 for 1..100) and `intro` (the first observation, formatted with
{lo}, {hi} and {max_turns}; default below; a short one keeps a small model's trajectories short). `reset(seed=None, secret=None, lo=None, hi=None)`:
a row's `lo` / `hi` replace the built ones for that episode; its `secret` is the number, else it
is drawn uniformly from [lo, hi] with random.Random(seed) (a seed gives the same secret on every
machine; no seed draws a fresh one).

The guess is read from the model's reply: the text after the last `</think>` if there is one; in
it, the content of the last `\\boxed{...}` if there is one; in that, the last number (`-3`, `42`,
`1,000`, `42.0`; not part of a word, so `qwen2` has none). A reply with no number, a number that is
not whole (`4.5`) or one outside [lo, hi] is an invalid move: it uses a turn and says so.

The observations, exactly ({lo}, {hi}, {max_turns}, {guess}, {secret} are the numbers):

    reset:        "Guess my number: a whole number from {lo} to {hi}. You have {max_turns} guesses;
                   after each one I say higher or lower. Reply with just the number."
                   (one line, the two parts joined by a space)
    too low:      "Higher than {guess}."
    too high:     "Lower than {guess}."
    correct:      "Correct! It was {secret}."
    no number:    "Invalid move: reply with a whole number from {lo} to {hi}."
    not whole:    "Invalid move: {guess} is not a whole number."   ({guess} as the model wrote it)
    out of range: "Invalid move: {guess} is not from {lo} to {hi}."

Reward 1.0 on the step that guesses the number (terminated=True), 0.0 on every other step. After
`max_turns` guesses without it, the last step is truncated=True and its observation ends with
" No guesses left. It was {secret}." The info of every step has `turn` (1, 2, ...) and `outcome`
("higher", "lower", "correct", "invalid"); the last step's also has `secret`.
"""

from __future__ import annotations

import numbers
import random
import re

from roll_lite.environments.registry import register_environment

INTRO = (
    "Guess my number: a whole number from {lo} to {hi}. You have {max_turns} guesses; after each one I say "
    "higher or lower. Reply with just the number."
)
_AFTER_THINKING = re.compile(r"</think>", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
# A number not glued to a word or to another number: -3, 42, 1,000, 42.0, 4.5.
_NUMBER = re.compile(r"(?<![\w.,])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w]|[.,]\d)")


def read_guess(reply: str) -> str | None:
    """The number the reply guesses, as written (e.g. "1,000", "4.5"), or None."""
    text = _AFTER_THINKING.split(reply)[-1]
    boxed = _BOXED.findall(text)
    if boxed:
        text = boxed[-1]
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def as_whole_number(written: str) -> int | None:
    """ "1,000" -> 1000, "42.0" -> 42, "4.5" -> None."""
    whole, _, fraction = written.replace(",", "").partition(".")
    return int(whole) if not fraction.strip("0") else None


@register_environment("guess_the_number")
class GuessTheNumber:
    def __init__(self, lo: int = 1, hi: int = 100, max_turns: int = 8, intro: str = INTRO):
        self.default_range = _checked_range(lo, hi)
        if not isinstance(intro, str) or not intro.strip():
            raise ValueError(f"intro must be a non-empty str, got {intro!r}")
        self.intro = intro
        if not _is_whole(max_turns) or max_turns < 1:
            raise ValueError(f"max_turns must be a whole number >= 1, got {max_turns!r}")
        self.max_turns = int(max_turns)
        self.secret: int | None = None

    def reset(
        self, seed: int | None = None, secret: int | None = None, lo: int | None = None, hi: int | None = None
    ) -> tuple[str, dict]:
        default_lo, default_hi = self.default_range
        self.lo, self.hi = _checked_range(default_lo if lo is None else lo, default_hi if hi is None else hi)
        if secret is None:
            secret = random.Random(seed).randint(self.lo, self.hi)
        elif not _is_whole(secret) or not self.lo <= secret <= self.hi:
            raise ValueError(f"secret must be a whole number from {self.lo} to {self.hi}, got {secret!r}")
        self.secret, self.turn = int(secret), 0
        return self.intro.format(lo=self.lo, hi=self.hi, max_turns=self.max_turns), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self.secret is None:
            raise RuntimeError("step() before reset()")
        self.turn += 1
        observation, outcome = self._answer(action)
        solved = outcome == "correct"
        out_of_turns = not solved and self.turn >= self.max_turns
        info = {"turn": self.turn, "outcome": outcome}
        if out_of_turns:
            observation += f" No guesses left. It was {self.secret}."
        if solved or out_of_turns:
            info["secret"] = self.secret
        return observation, float(solved), solved, out_of_turns, info

    def _answer(self, action: str) -> tuple[str, str]:
        written = read_guess(action)
        if written is None:
            return f"Invalid move: reply with a whole number from {self.lo} to {self.hi}.", "invalid"
        guess = as_whole_number(written)
        if guess is None:
            return f"Invalid move: {written} is not a whole number.", "invalid"
        if not self.lo <= guess <= self.hi:
            return f"Invalid move: {guess} is not from {self.lo} to {self.hi}.", "invalid"
        assert self.secret is not None  # step() refused to run before reset()
        if guess < self.secret:
            return f"Higher than {guess}.", "higher"
        if guess > self.secret:
            return f"Lower than {guess}.", "lower"
        return f"Correct! It was {self.secret}.", "correct"


def _is_whole(value) -> bool:
    """An int (numpy's too, as rows read from Parquet hold), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _checked_range(lo, hi) -> tuple[int, int]:
    for name, value in (("lo", lo), ("hi", hi)):
        if not _is_whole(value):
            raise ValueError(f"{name} must be a whole number, got {value!r}")
    if lo > hi:
        raise ValueError(f"lo ({lo}) is above hi ({hi})")
    return int(lo), int(hi)
