"""The embedded demo task: reverse a string of digits ("38125=" -> "52183").

Verifiable, tiny, and hard enough for a 1 M-parameter model that RL has something to do. Eval
prompts are held out: training prompts never repeat them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str


class ReverseDigitsTask:
    def __init__(self, min_digits: int = 3, max_digits: int = 7, num_eval: int = 64, seed: int = 0):
        if not 1 <= min_digits <= max_digits:
            raise ValueError(f"task: need 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}")
        self.min_digits, self.max_digits = min_digits, max_digits
        eval_rng = random.Random(f"eval-{seed}")
        self.eval_examples = []
        seen = set()
        while len(self.eval_examples) < num_eval:
            example = self._draw(eval_rng)
            if example.prompt not in seen:
                seen.add(example.prompt)
                self.eval_examples.append(example)
        self._eval_prompts = seen
        self._rng = random.Random(f"train-{seed}")

    @staticmethod
    def make(digits: str) -> Example:
        return Example(prompt=f"{digits}=", answer=digits[::-1])

    def _draw(self, rng: random.Random) -> Example:
        length = rng.randint(self.min_digits, self.max_digits)
        return self.make("".join(rng.choice("0123456789") for _ in range(length)))

    def train_examples(self, count: int) -> list[Example]:
        examples = []
        while len(examples) < count:
            example = self._draw(self._rng)
            if example.prompt not in self._eval_prompts:
                examples.append(example)
        return examples

    @property
    def max_answer_chars(self) -> int:
        return self.max_digits


def noisy_demonstration(example: Example, correct_fraction: float, rng: random.Random) -> str:
    """SFT target of a noisy demonstrator: the right answer with probability `correct_fraction`,
    otherwise a simpler wrong behaviour (copying the digits). It gives a sharp policy with low
    reward that RL can improve (see ../shared/PLATFORM.md: a pure-task SFT samples too broadly)."""
    if rng.random() < correct_fraction:
        return example.answer
    return example.prompt.rstrip("=")
