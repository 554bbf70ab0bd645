"""Tests for a program, and the verdict on it: which cases passed, decided here, outside the sandbox.

A row's tests are one of two kinds (JSON, or a dict):

    {"cases": [{"stdin": "1 2\\n", "stdout": "3\\n"}, ...]}                 stdin / stdout
    {"function": "add", "cases": [{"args": [1, 2], "expected": 3}, ...]}   function calls

Stdin cases run the program once each; its stdout must equal the case's, line by line, trailing
spaces and trailing blank lines aside. Function cases run in one sandbox: driver.py calls the
function on each case's arguments and prints the returned values as JSON, and they must equal the
expected values (floats within 1e-6 relative, bool is not int). The expected values never enter the
sandbox, so nothing the program prints, patches or exits with can claim a case it did not pass.

The verdict is `passed` (every case), else the worst thing seen: `timed_out` (wall-clock or CPU
limit), `memory_limit`, `output_limit`, `error` (a crash, a syntax error, an exception, no such
function, an exit before the cases ran) or `wrong_answer`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from roll_lite.sandbox.pool import SandboxPool
from roll_lite.sandbox.process import Run

VERDICTS = ("passed", "wrong_answer", "error", "output_limit", "memory_limit", "timed_out")  # mildest first
_DRIVER = (Path(__file__).parent / "driver.py").read_text(encoding="utf-8")


@dataclass(frozen=True)
class Tests:
    cases: list[dict]
    function: str | None = None  # None: stdin / stdout cases


@dataclass(frozen=True)
class Verdict:
    verdict: str
    passed: int
    total: int
    detail: str = ""  # the first failure, for the log


def parse_tests(value) -> Tests:
    """A row's tests (a dict, or its JSON text); ValueError names what is wrong."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"the tests are not valid JSON: {error}") from None
    if not isinstance(value, dict) or not isinstance(value.get("cases"), list) or not value["cases"]:
        raise ValueError(
            "the tests must be an object with a non-empty list 'cases' (and 'function' for function calls)"
        )
    function = value.get("function")
    if function is not None and (not isinstance(function, str) or not function.isidentifier()):
        raise ValueError(f"'function' must be a Python identifier, got {function!r}")
    needed = ("args", "expected") if function else ("stdin", "stdout")
    for index, case in enumerate(value["cases"]):
        if not isinstance(case, dict) or any(key not in case for key in needed):
            raise ValueError(f"case {index} must have the keys {' and '.join(needed)}, got {case!r}"[:300])
        if function and not isinstance(case["args"], list):
            raise ValueError(f"case {index}: 'args' must be a list, got {type(case['args']).__name__}")
        if not function and not (isinstance(case["stdin"], str) and isinstance(case["stdout"], str)):
            raise ValueError(f"case {index}: 'stdin' and 'stdout' must be strings")
    return Tests(value["cases"], function)


def judge(pool: SandboxPool, code: str, tests: Tests) -> Verdict:
    """Runs `code` against `tests` in the pool's sandboxes (this call blocks on one slot at a time)."""
    if tests.function is not None:
        return _judge_calls(pool, code, tests)
    passed, worst, detail = 0, "passed", ""
    for index, case in enumerate(tests.cases):
        run = pool.run({"solution.py": code}, pool.python("solution.py"), case["stdin"].encode())
        outcome = _ending(run) or (
            "passed" if _lines(run.stdout.decode(errors="replace")) == _lines(case["stdout"]) else "wrong_answer"
        )
        passed += outcome == "passed"
        if VERDICTS.index(outcome) > VERDICTS.index(worst):
            worst, detail = outcome, f"case {index}: {_describe(outcome, run)}"
        if outcome in ("timed_out", "memory_limit", "output_limit"):
            break  # the cases left count as failed: a hostile program costs one limit, not one per case
    return Verdict(worst, passed, len(tests.cases), detail)


def _judge_calls(pool: SandboxPool, code: str, tests: Tests) -> Verdict:
    calls = {
        "function": tests.function,
        "calls": [{"args": c["args"], "kwargs": c.get("kwargs", {})} for c in tests.cases],
    }
    run = pool.run(
        {"solution.py": code, "driver.py": _DRIVER, "calls.json": json.dumps(calls)}, pool.python("driver.py")
    )
    results: dict[int, dict] = {}
    load_error = None
    for line in run.stdout.decode(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("case"), int):
            results.setdefault(record["case"], record)
        elif isinstance(record, dict) and load_error is None and "load_error" in record:
            load_error = str(record["load_error"])
    right = [
        "value" in results.get(i, {}) and same_value(results[i]["value"], case["expected"])
        for i, case in enumerate(tests.cases)
    ]
    passed = sum(right)
    if passed == len(tests.cases):
        return Verdict("passed", passed, passed)
    errors = [str(r["error"]) for r in results.values() if "error" in r] + ([load_error] if load_error else [])
    if ending := _ending(run):
        return Verdict(ending, passed, len(tests.cases), _describe(ending, run))
    if any("MemoryError" in e for e in errors):
        return Verdict("memory_limit", passed, len(tests.cases), errors[0])
    if errors or len(results) < len(tests.cases) or run.exit_code != 0:
        why = errors[0] if errors else f"{len(results)} of {len(tests.cases)} cases ran; {_describe('error', run)}"
        return Verdict("error", passed, len(tests.cases), why)
    first = right.index(False)
    return Verdict(
        "wrong_answer",
        passed,
        len(tests.cases),
        f"case {first}: got {json.dumps(results[first].get('value'))[:100]}, expected {json.dumps(tests.cases[first]['expected'])[:100]}",
    )


def same_value(got, expected) -> bool:
    """JSON values equal: floats within 1e-6 relative (1e-9 absolute), bool distinct from int."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(got) is type(expected) and got == expected
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)):
        return math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9)
    if isinstance(expected, list) and isinstance(got, list):
        return len(got) == len(expected) and all(same_value(g, e) for g, e in zip(got, expected))
    if isinstance(expected, dict) and isinstance(got, dict):
        return got.keys() == expected.keys() and all(same_value(got[k], expected[k]) for k in expected)
    return type(got) is type(expected) and got == expected


def _ending(run: Run) -> str | None:
    """The verdict a run's ending forces, or None when it exited by itself."""
    if run.ending != "exited":
        return run.ending
    if run.cpu_limited:
        return "timed_out"
    if run.exit_code != 0:
        return "memory_limit" if b"MemoryError" in run.stderr else "error"
    return None


def _describe(outcome: str, run: Run) -> str:
    tail = run.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
    how = (
        "the wall-clock limit"
        if run.ending == "timed_out"
        else "the CPU limit"
        if run.cpu_limited
        else "the output cap"
        if run.ending == "output_limit"
        else f"exit {run.exit_code}"
    )
    return f"{outcome} ({how}, {run.wall_s:.2f} s){': ' + tail[0][:200] if tail[0] else ''}"


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines
