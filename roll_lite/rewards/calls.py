"""One reward call: the function's return value checked, an exception turned into a reason."""

from __future__ import annotations

import math
import numbers


def as_score(value) -> float:
    """`value` as a finite float (a bool or an int is fine); anything else raises, naming what it was."""
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, numbers.Real):
        raise TypeError(f"returned a {type(value).__name__}, not a number")
    score = float(value)
    if not math.isfinite(score):
        raise ValueError(f"returned {score}")
    return score


def call(fn, response: str, ground_truth: str, extra: dict) -> tuple[float, str | None]:
    """(score, None), or (0.0, reason) when `fn` raised or returned no finite number."""
    try:
        return as_score(fn(response, ground_truth, extra)), None
    except (Exception, SystemExit) as error:  # a user's sys.exit() fails that call only
        return 0.0, describe(error)


def describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    reason = f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
    return reason if len(reason) <= 300 else reason[:297] + "..."
