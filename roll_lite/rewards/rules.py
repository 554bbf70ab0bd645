"""Rule rewards on the response text: cheap, bounded and run in the reward worker's own process."""

from __future__ import annotations

import re

from roll_lite.rewards.registry import register_reward


@register_reward("exact_answer", cheap=True)
def exact_answer(response: str, ground_truth: str, extra: dict | None = None) -> float:
    """1 if the response, stripped of surrounding whitespace, is exactly the answer."""
    return float(response.strip() == ground_truth.strip())


@register_reward("token_accuracy", cheap=True)
def token_accuracy(response: str, ground_truth: str, extra: dict | None = None) -> float:
    """Fraction of answer characters matched position by position (a longer response is penalised)."""
    response, ground_truth = response.strip(), ground_truth.strip()
    if not ground_truth:
        return float(not response)
    matches = sum(a == b for a, b in zip(response, ground_truth))
    return matches / max(len(ground_truth), len(response))


@register_reward("format", cheap=True)
def answer_format(response: str, ground_truth: str, extra: dict | None = None) -> float:
    """1 if the response is exactly one '<answer>...</answer>' block, optionally after reasoning."""
    return float(re.fullmatch(r"(?s)[^<]*<answer>[^<]+</answer>\s*", response) is not None)


@register_reward("digits_only", cheap=True)
def digits_only(response: str, ground_truth: str, extra: dict | None = None) -> float:
    """1 if the response is a non-empty string of digits (the demo task's format)."""
    return float(re.fullmatch(r"\d+", response.strip()) is not None)
