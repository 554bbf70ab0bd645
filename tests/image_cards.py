"""color_cards (roll_lite/environments/color_cards.py) with rows that break in the third observation, for
tests/test_multi_turn_images.py: `broken: bytes` shows bytes that are no image (the environment's process finds
it: the fault "bad_image"), `broken: wide` a 300 x 1 strip the processor refuses (the driver finds it: the
same fault). Light imports only: every environment process imports this module."""

from __future__ import annotations

from PIL import Image

from roll_lite.environments.color_cards import ColorCards


class Cards(ColorCards):
    def reset(self, seed=None, colors=None, broken=None):
        self.broken = broken
        return super().reset(seed=seed, colors=colors)

    def step(self, action):
        observation, *rest = super().step(action)
        if self.broken and self.turn == 2:
            image = b"not an image" if self.broken == "bytes" else Image.new("RGB", (300, 1))
            observation = [{"type": "image", "image": image}, {"type": "text", "text": "and this?"}]
        return (observation, *rest)
