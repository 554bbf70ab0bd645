"""`math`: the response's final answer checked against the ground truth with HF math-verify
(\\boxed{} and LaTeX answers, fractions vs decimals, numeric and symbolic equivalence).

math-verify bounds its own work with signal.alarm, which only works in a process's main thread
(inside a thread it raises). Its timeouts are switched off here: the reward runner calls `math` in a
guarded subprocess and kills the call after `reward.timeout_s`, which is counted in the metrics.
Called directly (not through the runner), a pathological expression is not time-bounded.
"""

from __future__ import annotations

import logging

from roll_lite.rewards.registry import register_reward


class _DropTimeoutDisabledNotice(logging.Filter):
    """math-verify warns once per process that its timeouts are off; the runner's timeout is on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


def _math_verify():
    import math_verify  # imported on first use: it loads sympy and antlr (~0.7 s)

    for name in ("math_verify.parser", "math_verify.grader"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropTimeoutDisabledNotice) for f in logger.filters):
            logger.addFilter(_DropTimeoutDisabledNotice())
    return math_verify


def parse_ground_truth(ground_truth: str) -> list:
    """The ground truth as math-verify expressions. A bare answer ('1/2', '\\frac{1}{2}', '(1, 2)',
    '1,000') is read as LaTeX math ($...$); one that already has $...$ or \\boxed{} as it is."""
    mv = _math_verify()
    text = ground_truth.strip()
    wrapped = text if ("$" in text or "\\boxed" in text) else f"${text}$"
    parsed = mv.parse(wrapped, parsing_timeout=None) or mv.parse(text, parsing_timeout=None)
    if not parsed:
        raise ValueError(f"math-verify cannot parse the ground truth {ground_truth!r}")
    return parsed


@register_reward("math")
def math_answer(response: str, ground_truth: str, extra: dict | None = None) -> float:
    """1 if the response's final answer (\\boxed{...} first, else the last LaTeX or plain expression
    math-verify finds) equals the ground truth, else 0 (also with no answer at all). A ground truth
    that math-verify cannot read raises: the runner counts it as a failed call."""
    mv = _math_verify()
    gold = parse_ground_truth(ground_truth)
    answer = mv.parse(response, parsing_timeout=None)
    return float(bool(answer) and mv.verify(gold, answer, timeout_seconds=None))


math_answer.warm_up = _math_verify  # the guarded process imports math-verify before the first timed call
