"""Rule rewards: plain functions registered by name.

A reward function takes (response, ground_truth) strings and returns a float. The reward worker
combines them with weights from config, e.g. `reward.functions: {exact_answer: 1.0, format: 0.1}`.
"""

from __future__ import annotations

import math
import re
from typing import Callable

RewardFn = Callable[[str, str], float]
REWARD_FUNCTIONS: dict[str, RewardFn] = {}


def register_reward(name: str):
    def register(fn: RewardFn) -> RewardFn:
        if name in REWARD_FUNCTIONS:
            raise ValueError(f"reward function '{name}' is already registered")
        REWARD_FUNCTIONS[name] = fn
        return fn

    return register


def get_reward(name: str) -> RewardFn:
    if name not in REWARD_FUNCTIONS:
        raise KeyError(f"unknown reward function '{name}'; registered: {', '.join(sorted(REWARD_FUNCTIONS))}")
    return REWARD_FUNCTIONS[name]


@register_reward("exact_answer")
def exact_answer(response: str, ground_truth: str) -> float:
    """1 if the response, stripped of surrounding whitespace, is exactly the answer."""
    return float(response.strip() == ground_truth.strip())


@register_reward("token_accuracy")
def token_accuracy(response: str, ground_truth: str) -> float:
    """Fraction of answer characters matched position by position (a longer response is penalised)."""
    response, ground_truth = response.strip(), ground_truth.strip()
    if not ground_truth:
        return float(not response)
    matches = sum(a == b for a, b in zip(response, ground_truth))
    return matches / max(len(ground_truth), len(response))


_NUMBER = r"[-+]?(?:\d+(?:,\d{3})*(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?"


def extract_final_answer(text: str) -> str | None:
    """The final answer of a worked solution: \\boxed{...}, then '#### x', then 'answer: x', then
    the last number in the text."""
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
    if boxed:
        return boxed[-1].strip()
    for pattern in (r"####\s*(" + _NUMBER + ")", r"answer\s*(?:is|:)\s*\$?(" + _NUMBER + ")"):
        found = re.findall(pattern, text, flags=re.IGNORECASE)
        if found:
            return found[-1]
    numbers = re.findall(_NUMBER, text)
    return numbers[-1] if numbers else None


def _to_number(text: str) -> float | None:
    text = text.replace(",", "").replace("$", "").strip()
    if re.fullmatch(r"[-+]?\d+/\d+", text):
        numerator, denominator = text.split("/")
        return float(numerator) / float(denominator) if float(denominator) else None
    try:
        return float(text)
    except ValueError:
        return None


@register_reward("math_answer")
def math_answer(response: str, ground_truth: str) -> float:
    """1 if the response's final answer equals the ground truth numerically (rel. tol. 1e-6)."""
    answer = extract_final_answer(response)
    if answer is None:
        return 0.0
    got, want = _to_number(answer), _to_number(ground_truth)
    if got is None or want is None:
        return float(answer.strip() == ground_truth.strip())
    return float(math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9))


@register_reward("format")
def answer_format(response: str, ground_truth: str) -> float:
    """1 if the response is exactly one '<answer>...</answer>' block, optionally after reasoning."""
    return float(re.fullmatch(r"(?s)[^<]*<answer>[^<]+</answer>\s*", response) is not None)


@register_reward("digits_only")
def digits_only(response: str, ground_truth: str) -> float:
    """1 if the response is a non-empty string of digits (the demo task's format)."""
    return float(re.fullmatch(r"\d+", response.strip()) is not None)
