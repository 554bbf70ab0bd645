"""Reward functions (hand-worked values), the runner's handling of calls that raise, hang, crash or
return no number, and the reward worker's weighted sum and metrics. No Ray here."""

import logging
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from roll_lite.workers.reward_worker import RewardWorker

from roll_lite.config import RewardConfig
from roll_lite.rewards import CHEAP_REWARDS, REWARD_FUNCTIONS, get_reward, resolve_reward
from roll_lite.rewards.calls import as_score, call
from roll_lite.rewards.runner import RewardRunner


def test_exact_answer_and_token_accuracy():
    exact, accuracy = get_reward("exact_answer"), get_reward("token_accuracy")
    assert exact(" 321 ", "321", {}) == 1.0 and exact("3210", "321", {}) == 0.0
    assert accuracy("324", "321", {}) == pytest.approx(2 / 3)
    assert accuracy("3210", "321", {}) == pytest.approx(3 / 4)
    assert accuracy("", "321", {}) == 0.0


def test_format_rewards():
    assert get_reward("format")("think first <answer>12</answer>", "12", {}) == 1.0
    assert get_reward("format")("<answer>1</answer><answer>2</answer>", "2", {}) == 0.0
    assert get_reward("format")("12", "12", {}) == 0.0
    assert get_reward("digits_only")("0123", "x", {}) == 1.0 and get_reward("digits_only")("12a", "x", {}) == 0.0
    with pytest.raises(KeyError, match="registered: .*exact_answer"):
        get_reward("nope")


def test_the_registry_and_which_built_ins_run_inline():
    assert set(REWARD_FUNCTIONS) == {"exact_answer", "token_accuracy", "format", "digits_only", "math", "reasoning_gym"}
    # math and reasoning_gym (a task's scorer may parse with sympy) run guarded
    assert CHEAP_REWARDS == {"exact_answer", "token_accuracy", "format", "digits_only"}
    assert resolve_reward("roll_lite.rewards.rules:exact_answer") is get_reward("exact_answer")


@pytest.mark.parametrize(
    "response, ground_truth, expected",
    [
        ("so the answer is \\boxed{0.5}", "1/2", 1.0),  # decimal vs fraction
        ("The answer is $\\frac{1}{2}$", "0.5", 1.0),  # LaTeX fraction vs decimal
        ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", 1.0),
        ("#### 1,000", "1000", 1.0),  # a thousands separator is read as one number
        ("\\boxed{1000}", "1,000", 1.0),
        ("\\boxed{1,5}", "1.5", 0.0),  # ... so a decimal comma is not 1.5
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),  # symbolic equivalence
        ("\\boxed{10^{3}}", "1000", 1.0),
        ("\\boxed{0.333333}", "1/3", 1.0),  # numeric equivalence to 6 decimals (math-verify's float_rounding)
        ("\\boxed{0.33}", "1/3", 0.0),
        ("first 7, then \\boxed{12}", "12", 1.0),  # the boxed answer wins
        ("\\boxed{(1, 2)}", "(1, 2)", 1.0),  # a bare ground truth is read as LaTeX: an interval, not 2
        ("\\boxed{3}", "4", 0.0),  # wrong
        ("I do not know", "3", 0.0),  # no answer
        ("", "3", 0.0),
    ],
)
def test_math_reward_uses_math_verify(response, ground_truth, expected):
    assert get_reward("math")(response, ground_truth, {}) == expected


def test_math_reward_raises_on_a_ground_truth_math_verify_cannot_read():
    with pytest.raises(ValueError, match="math-verify cannot parse the ground truth '\\$\\$'"):
        get_reward("math")("\\boxed{1}", "$$", {})


def test_as_score_takes_finite_numbers_only():
    assert as_score(True) == 1.0 and as_score(3) == 3.0 and as_score(np.float32(0.5)) == 0.5
    assert as_score(np.int64(2)) == 2.0
    for value, reason in [
        ("1", "returned a str, not a number"),
        (None, "returned a NoneType"),
        (math.nan, "returned nan"),
        (-math.inf, "returned -inf"),
        ([1.0], "returned a list"),
    ]:
        with pytest.raises((TypeError, ValueError), match=reason):
            as_score(value)
    assert call(lambda r, g, e: 1 / 0, "a", "b", {}) == (0.0, "ZeroDivisionError: division by zero")
    assert call(lambda r, g, e: sys.exit(4), "a", "b", {}) == (0.0, "SystemExit: 4")


USER_REWARDS = """
import math, os, sys, time

def by_extra(response, ground_truth, extra):
    return extra["weight"] * float(response == ground_truth)

def flaky(response, ground_truth, extra):
    print("flaky was called")  # prints must not disturb the runner
    if response == "raise":
        raise ValueError("cannot score " + response)
    if response == "hang":
        while True:
            time.sleep(1)
    if response == "nan":
        return math.nan
    if response == "text":
        return "1.0"
    if response == "crash":
        os._exit(3)
    return len(response)
"""


@pytest.fixture
def user_rewards(tmp_path, monkeypatch):
    (tmp_path / "user_rewards_for_test.py").write_text(textwrap.dedent(USER_REWARDS))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "user_rewards_for_test"
    sys.modules.pop("user_rewards_for_test", None)


def test_runner_gives_a_typed_outcome_to_calls_that_raise_hang_crash_or_return_no_number(user_rewards):
    runner = RewardRunner([f"{user_rewards}:flaky"], timeout_s=1.0)
    try:
        responses = ["ab", "raise", "abc", "hang", "a", "nan", "text", "crash", "abcd"]
        start = time.monotonic()
        outcomes = runner.score(f"{user_rewards}:flaky", responses, ["x"] * 9, [{}] * 9)
        elapsed = time.monotonic() - start
        assert [o.value for o in outcomes] == [2.0, 0.0, 3.0, 0.0, 1.0, 0.0, 0.0, 0.0, 4.0]
        assert [o.kind for o in outcomes] == [
            "ok",
            "failed",
            "ok",
            "timed_out",
            "ok",
            "failed",
            "failed",
            "failed",
            "ok",
        ]
        assert outcomes[1].reason == "ValueError: cannot score raise"
        assert all(o.reason for o in outcomes if not o.ok)
        # The hang is bounded by the timeout (plus two restarts of the process: hang and crash).
        assert 1.0 <= elapsed < 15.0, elapsed
        assert runner.process.starts == 3
        # The process goes on serving the next batch.
        again = runner.score(f"{user_rewards}:flaky", ["hang", "abcde"], ["x", "x"], [{}, {}])
        assert [(o.kind, o.value) for o in again] == [("timed_out", 0.0), ("ok", 5.0)]
        assert again[0].reason == "no result within reward.timeout_s=1 s"
    finally:
        runner.close()
    assert runner.process.process.poll() is not None  # closed: nothing left running


def test_a_guarded_child_started_by_a_thread_that_ends_lives_on(user_rewards):
    """The reward worker starts (and restarts) its children from pool threads that end with each batch;
    a child's parent-death signal follows the thread that started it, so the spawner thread starts them."""
    runners: list[RewardRunner] = []
    thread = threading.Thread(target=lambda: runners.append(RewardRunner([f"{user_rewards}:flaky"], timeout_s=60.0)))
    thread.start()
    thread.join()
    try:
        assert [o.value for o in runners[0].score(f"{user_rewards}:flaky", ["ab"], ["x"], [{}])] == [2.0]
        assert runners[0].process.starts == 1  # not killed with the thread and started again
    finally:
        runners[0].close()


SPINNING_PARENT = """
import sys
sys.path.insert(0, sys.argv[1])
from roll_lite.rewards.guarded import GuardedProcess
guard = GuardedProcess(["spin_reward_for_test:spin"])
print(guard.process.pid, flush=True)
guard.score("spin_reward_for_test:spin", [("a", "b", {})], timeout_s=600)
"""


def test_a_guarded_child_stuck_in_c_code_holding_the_gil_dies_with_its_parent(tmp_path):
    """sum() over a range is one C loop that never lets the GIL go: the child's exit-with-parent
    thread cannot run, and only the kernel's parent-death signal ends it."""
    (tmp_path / "spin_reward_for_test.py").write_text(
        "def spin(response, answer, extra):\n    return sum(range(10**15))\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", SPINNING_PARENT, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child = int(parent.stdout.readline())
        loaded, deadline = cpu_seconds(child) or 0.0, time.monotonic() + 60
        while (cpu_seconds(child) or 0.0) < loaded + 0.3 and time.monotonic() < deadline:  # the call is spinning
            time.sleep(0.05)
        assert cpu_seconds(child) is not None, "the child died before its parent"
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 3
        while cpu_seconds(child) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cpu_seconds(child) is None, "the child outlived its SIGKILLed parent"
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
        if child is not None and cpu_seconds(child) is not None:
            os.kill(child, signal.SIGKILL)


def cpu_seconds(pid: int) -> float | None:
    """The process's user + system CPU seconds; None once it is gone (or a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    if fields[0] in ("Z", "X"):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_score_is_ok_with_a_finite_value_or_names_why_it_is_not():
    from roll_lite.rewards.outcomes import Score, failed, scored, unparseable

    assert scored(0.5).ok and not failed("boom").ok and unparseable("no verdict").kind == "unparseable"
    for bad in (
        dict(kind="ok", value=float("nan")),
        dict(kind="failed", reason=None),
        dict(kind="failed", value=1.0, reason="x"),
        dict(kind="zero"),
    ):
        with pytest.raises(ValueError):
            Score(**bad)


def test_reward_worker_weights_functions_passes_extras_and_counts_failures(user_rewards, caplog):
    worker = RewardWorker(
        RewardConfig(
            functions={"exact_answer": 1.0, f"{user_rewards}:by_extra": 0.5, f"{user_rewards}:flaky": 0.25},
            timeout_s=2.0,
        )
    )
    try:
        with caplog.at_level(logging.WARNING, logger="roll_lite.rewards"):
            scores, scored, metrics = worker.score(
                ["12", "raise", "7"], ["12", "3", "7"], [{"weight": 2.0}, {"weight": 4.0}, {"weight": 1.0}]
            )
        # exact: [1, 0, 1]; by_extra: weight * exact = [2, 0, 1]; flaky: len = [2, failed, 1]
        assert scores.tolist() == pytest.approx([1 + 0.5 * 2 + 0.25 * 2, 0.0, 1 + 0.5 * 1 + 0.25 * 1])
        assert scored.tolist() == [True, False, True]
        assert metrics["reward/exact_answer"] == pytest.approx(2 / 3)
        assert metrics[f"reward/{user_rewards}:by_extra"] == pytest.approx(1.0)
        assert metrics[f"reward/{user_rewards}:flaky"] == pytest.approx(1.5)  # over the two rows it scored
        assert metrics[f"reward/{user_rewards}:flaky/failed"] == 1.0
        assert metrics[f"reward/{user_rewards}:flaky/timed_out"] == 0.0
        assert metrics[f"reward/{user_rewards}:flaky/unparseable"] == 0.0
        assert metrics["reward/exact_answer/failed"] == 0.0 and metrics["reward/unscored"] == 1.0
        warnings = [r.getMessage() for r in caplog.records]
        assert warnings == [
            f"rewards: 1 of 3 responses unscored ({user_rewards}:flaky: 1 failed), scored 0 by those "
            f"sources (reward.on_failure=zero); first: {user_rewards}:flaky: ValueError: cannot score raise"
        ]
        # No extras (the pipeline has none): by_extra finds no 'weight' and fails on every row.
        scores, scored, metrics = worker.score(["1"], ["1"], None)
        assert scores.tolist() == [1.0 + 0.25 * 1] and metrics[f"reward/{user_rewards}:by_extra/failed"] == 1.0
        assert scored.tolist() == [False]
    finally:
        worker.close()


def test_an_inline_built_in_that_raises_is_counted_too():
    worker = RewardWorker(RewardConfig(functions={"token_accuracy": 1.0}))
    scores, scored, metrics = worker.score(["12", None], ["12", "3"])  # None has no .strip()
    assert scores.tolist() == [1.0, 0.0] and metrics["reward/token_accuracy/failed"] == 1.0
    assert scored.tolist() == [True, False]


def test_math_runs_in_the_guarded_process():
    worker = RewardWorker(RewardConfig(functions={"math": 1.0}, timeout_s=30.0))
    try:
        assert worker.runner.process is not None and not worker.runner.inline
        scores, _, metrics = worker.score(["\\boxed{\\frac{1}{2}}", "\\boxed{2}", "none"], ["0.5", "3", "1"])
        assert scores.tolist() == [1.0, 0.0, 0.0] and metrics["reward/math/failed"] == 0.0
    finally:
        worker.close()
