"""Running untrusted programs: isolation (isolation.py), limits (limits.py), one run (process.py),
a bounded pool that proves at start-up that it isolates (pool.py), and the test harness that decides
outside the sandbox which cases passed (harness.py, driver.py). Standard library only, so it can be
used, and tested, from any Python. docs/sandbox.md says which mechanism enforces which limit.
"""

from roll_lite.sandbox.harness import Tests, Verdict, judge, parse_tests
from roll_lite.sandbox.isolation import Isolation, SandboxUnavailable
from roll_lite.sandbox.limits import Limits
from roll_lite.sandbox.pool import SandboxPool
from roll_lite.sandbox.process import Run, SandboxError, run_program

__all__ = [
    "Isolation",
    "Limits",
    "Run",
    "SandboxError",
    "SandboxPool",
    "SandboxUnavailable",
    "Tests",
    "Verdict",
    "judge",
    "parse_tests",
    "run_program",
]
