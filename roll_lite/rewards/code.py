"""The `code` reward source: the response's program run against the row's tests in the sandbox
(roll_lite/sandbox/). Its score is the fraction of cases passed (reward.code_score=fraction) or 1 / 0
(all); the program's verdict (passed, wrong_answer, error, timed_out, memory_limit, output_limit, or
no_code when the response holds none) is a score the policy earned, counted in
reward/code/programs/<verdict>. Only the sandbox failing (SandboxError) leaves a response unscored
(`failed`), and then reward.on_failure decides.
"""

from __future__ import annotations

import json
import re
from collections import Counter

from roll_lite.rewards.outcomes import Score, failed, scored
from roll_lite.sandbox.harness import VERDICTS, Tests, judge, parse_tests
from roll_lite.sandbox.limits import Limits
from roll_lite.sandbox.process import SandboxError

EXTRACTIONS = ("fenced", "whole")
SCORINGS = ("fraction", "all")
PROGRAM_VERDICTS = (*VERDICTS, "no_code")
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(response: str, mode: str) -> str | None:
    """The program in a response: `fenced`: the last fenced block (``` or ```python; an unclosed last
    fence runs to the end); `whole`: the whole response. None when there is no code."""
    if mode == "whole":
        return response if response.strip() else None
    blocks = [
        body for language, body in _FENCE.findall(response) if language.lower() in ("", "python", "py", "python3")
    ]
    return blocks[-1] if blocks and blocks[-1].strip() else None


def sandbox_limits(box) -> Limits:
    """The Limits of a SandboxConfig (reward.sandbox); ValueError names a bad one."""
    return Limits(
        box.wall_s, box.cpu_s, box.memory_mb, box.file_mb, box.disk_mb, box.open_files, box.processes, box.output_kb
    )


class CodeReward:
    def __init__(self, reward):
        """`reward`: the run's RewardConfig (code_tests_key, code_extract, code_score, sandbox)."""
        from roll_lite.sandbox.isolation import Isolation
        from roll_lite.sandbox.pool import SandboxPool

        box = reward.sandbox
        self.pool = SandboxPool(Isolation(box.isolation, box.python or ""), sandbox_limits(box), box.workers)
        self.tests_key, self.extract, self.all_or_nothing = (
            reward.code_tests_key,
            reward.code_extract,
            reward.code_score == "all",
        )

    def describe(self) -> str:
        box = self.pool.limits
        return (
            f"code reward: sandbox {self.pool.isolation.mode}, {self.pool.workers} at once, {box.wall_s:g} s wall / "
            f"{box.cpu_s} s CPU, {box.memory_mb} MB, {box.processes} processes, tests from row field "
            f"'{self.tests_key}', code {self.extract}"
        )

    def score(self, responses: list[str], extras: list[dict]) -> tuple[list[Score], dict[str, float]]:
        """A Score per response, and the count of each program verdict (reward/code/programs/<verdict>).
        Identical programs against identical tests in one batch run once (a group of samples often
        repeats itself): a program that reads the clock or draws random numbers gets one draw per batch."""
        items = [
            (extract_code(response, self.extract), extra.get(self.tests_key))
            for response, extra in zip(responses, extras)
        ]
        keys = [json.dumps(item, sort_keys=True, default=str) for item in items]
        unique = dict(zip(keys, items))
        judged = dict(zip(unique, self.pool.map(self._one, list(unique.values()))))
        outcomes = [judged[key] for key in keys]
        counts = Counter(verdict for _, verdict in outcomes if verdict)
        return [score for score, _ in outcomes], {f"programs/{v}": float(counts[v]) for v in PROGRAM_VERDICTS}

    def _one(self, item: tuple[str | None, object]) -> tuple[Score, str | None]:
        code, raw_tests = item
        try:
            tests: Tests = parse_tests(raw_tests)
        except ValueError as error:  # the data check at start-up lets no such row through
            return failed(f"row field '{self.tests_key}': {error}"), None
        if code is None:
            return scored(0.0), "no_code"
        try:
            verdict = judge(self.pool, code, tests)
        except SandboxError as error:
            return failed(f"sandbox: {error}"), None
        if self.all_or_nothing:
            return scored(float(verdict.passed == verdict.total)), verdict.verdict
        return scored(verdict.passed / verdict.total), verdict.verdict

    def close(self) -> None:
        self.pool.close()


def code_row_check(reward, domain_key: str):
    """A check of one row's extra fields (raises ValueError) for the rows the code source scores, or
    None when no source is `code`: bad tests stop the run before it starts, naming the row."""
    from roll_lite.rewards.routing import routes

    code_domains = {domain for domain, sources in routes(reward).items() if sources.code}
    if not code_domains:
        return None

    def check(extra: dict) -> None:
        if None not in code_domains and extra.get(domain_key) not in code_domains:
            return
        if reward.code_tests_key not in extra:
            raise ValueError(
                f"key '{reward.code_tests_key}': missing (reward.code scores each row against the tests "
                "in reward.code_tests_key; a data.extra_keys list must name it)"
            )
        try:
            parse_tests(extra[reward.code_tests_key])
        except ValueError as error:
            raise ValueError(f"key '{reward.code_tests_key}': {error}") from None

    return check
