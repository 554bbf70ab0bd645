"""`color_cards`: a tiny game with images, for a vision-language policy (docs/vision.md). The environment shows a
card (a square of one color, drawn with Pillow), asks its color, asks it again from memory, then shows a second
card and asks its color: three model turns, with an image in the first observation and in the third.

    environment: {name: color_cards, kwargs: {size: 16}}

Built with `size` (the cards' side in pixels, default 16). `reset(seed=None, colors=None)`: a row's `colors`
(two names of COLORS) are the cards, else they are drawn with random.Random(seed).

The observations, exactly ({c} is the card's color):

    reset:   [image of card 1, "color?"]
    step 1:  "again?"                      (reward: the reply names card 1's color)
    step 2:  [image of card 2, "and this?"] (reward: the reply names card 1's color)
    step 3:  "it was {c}."                 (reward: the reply names card 2's color; terminated)

A reply names a color when it holds that color's name (any case) and no other color's. The info of every step
has `turn` and `right`.
"""

from __future__ import annotations

import random

from roll_lite.environments.registry import register_environment

COLORS = {"red": (220, 30, 30), "green": (30, 180, 30), "blue": (30, 30, 220), "white": (240, 240, 240)}


def names_color(reply: str, color: str) -> bool:
    text = reply.lower()
    return color in text and not any(other in text for other in COLORS if other != color)


def card(color: str, size: int):
    from PIL import Image

    return Image.new("RGB", (size, size), COLORS[color])


@register_environment("color_cards")
class ColorCards:
    def __init__(self, size: int = 16):
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"size must be a whole number of pixels >= 1, got {size!r}")
        self.size = size
        self.colors: list[str] | None = None

    def reset(self, seed: int | None = None, colors: list[str] | None = None) -> tuple[list[dict], dict]:
        if colors is None:
            draw = random.Random(seed)
            colors = [draw.choice(sorted(COLORS)) for _ in range(2)]
        if not isinstance(colors, (list, tuple)) or len(colors) != 2 or not all(c in COLORS for c in colors):
            raise ValueError(f"colors must be two of {', '.join(COLORS)}, got {colors!r}")
        self.colors, self.turn = list(colors), 0
        return [{"type": "image", "image": card(self.colors[0], self.size)}, {"type": "text", "text": "color?"}], {}

    def step(self, action: str) -> tuple[str | list[dict], float, bool, bool, dict]:
        if self.colors is None:
            raise RuntimeError("step() before reset()")
        self.turn += 1
        asked = self.colors[0] if self.turn <= 2 else self.colors[1]
        right = names_color(action, asked)
        info = {"turn": self.turn, "right": right}
        if self.turn == 1:
            return "again?", float(right), False, False, info
        if self.turn == 2:
            observation = [
                {"type": "image", "image": card(self.colors[1], self.size)},
                {"type": "text", "text": "and this?"},
            ]
            return observation, float(right), False, False, info
        return f"it was {asked}.", float(right), True, False, info
