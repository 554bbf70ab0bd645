"""The code reward source and its sandbox: tests parsed strictly, code extracted, values compared
outside the sandbox, the start-up check that refuses a sandbox that does not isolate, the weaker
rlimits mode only on request, the rootless mode, and the reward worker's outcomes and metrics."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from roll_lite.workers.reward_worker import RewardWorker

from roll_lite.config import ConfigError, RewardConfig, load_config
from roll_lite.config.reward import DomainRewardConfig
from roll_lite.data.files import DataError
from roll_lite.data.prompts import prepare_datasets
from roll_lite.model.tokenizer import build_char_tokenizer
from roll_lite.rewards import code as code_source
from roll_lite.rewards.code import code_row_check, extract_code
from roll_lite.sandbox import Isolation, Limits, SandboxError, SandboxPool, SandboxUnavailable, judge, parse_tests
from roll_lite.sandbox.harness import same_value

REPO = Path(__file__).resolve().parents[1]
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
CALLS = {"function": "add", "cases": [{"args": [1, 2], "expected": 3}, {"args": [5, -5], "expected": 0}]}
STDIO = {"cases": [{"stdin": "1 2\n", "stdout": "3\n"}, {"stdin": "5 -5\n", "stdout": "0"}]}
LIMITS = Limits(wall_s=3.0, cpu_s=2, memory_mb=512, processes=12)


def test_ci_has_the_sandbox():
    """On CI (CI=true; scripts/setup.sh installs bubblewrap as root) the sandbox tests must run, not skip."""
    if os.environ.get("CI", "").lower() not in ("1", "true"):
        pytest.skip("not CI: without bubblewrap the sandbox tests skip")
    assert shutil.which("bwrap"), "bubblewrap is missing on CI: scripts/setup.sh should have installed it"


@pytest.mark.parametrize(
    "tests, message",
    [
        ("{not json", "not valid JSON"),
        ({"cases": []}, "non-empty list 'cases'"),
        ({"function": "add", "cases": [{"args": [1]}]}, "case 0 must have the keys args and expected"),
        ({"function": "add", "cases": [{"args": 1, "expected": 1}]}, "case 0: 'args' must be a list"),
        ({"function": "not a name", "cases": [{"args": [], "expected": 1}]}, "must be a Python identifier"),
        ({"cases": [{"stdin": "1", "stdout": 1}]}, "'stdin' and 'stdout' must be strings"),
    ],
)
def test_bad_tests_are_refused_naming_the_problem(tests, message):
    with pytest.raises(ValueError, match=message):
        parse_tests(tests)


def test_tests_may_come_as_json_text():
    assert parse_tests(json.dumps(CALLS)).function == "add"


def test_values_are_compared_as_json_values_with_a_float_tolerance():
    assert same_value(0.1 + 0.2, 0.3) and same_value([1, {"a": 2.0}], [1, {"a": 2}])
    assert not same_value(True, 1) and not same_value(1, True) and not same_value("3", 3)
    assert not same_value([1, 2], [1, 2, 3]) and not same_value({"a": 1}, {"a": 1, "b": 2}) and not same_value(None, 0)


@pytest.mark.parametrize(
    "response, mode, code",
    [
        ("Here:\n```python\ndef f(x):\n    return x\n```\ndone", "fenced", "def f(x):\n    return x\n"),
        ("```\nfirst\n```\nthen\n```py\nsecond\n```", "fenced", "second\n"),
        ("```python\nunclosed = 1\n", "fenced", "unclosed = 1\n"),
        ("```text\nnot code\n```", "fenced", None),
        ("no code at all", "fenced", None),
        ("def f(x): return x", "whole", "def f(x): return x"),
        ("   ", "whole", None),
    ],
)
def test_code_is_extracted_from_the_response(response, mode, code):
    assert extract_code(response, mode) == code


def test_limits_are_checked():
    with pytest.raises(ValueError, match="wall_s must be a positive number"):
        Limits(wall_s=0)
    with pytest.raises(ValueError, match="open_files must be at least 16"):
        Limits(open_files=4)


def test_a_missing_bwrap_is_a_start_up_error_that_names_the_weaker_choice(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(
        SandboxUnavailable, match=r"needs bash, prlimit, bwrap.*apt-get install bubblewrap.*isolation=rlimits"
    ):
        Isolation("bwrap").require()
    with pytest.raises(ValueError, match="must be one of bwrap, rlimits"):
        Isolation("docker")


@needs_bwrap
def test_a_sandbox_that_does_not_start_is_refused_at_start_up(monkeypatch):
    real = Isolation.command

    def broken(self, argv, code_dir, work_dir, user, limits, ready_fd):
        command = real(self, argv, code_dir, work_dir, user, limits, ready_fd)
        return type(command)(
            [*command.argv[:1], "--ro-bind", "/no/such/dir", "/x", *command.argv[1:]],
            command.env,
            command.cwd,
            command.user,
        )

    monkeypatch.setattr(Isolation, "command", broken)
    with pytest.raises(SandboxUnavailable, match="does not start: bwrap did not start the program.*no/such/dir"):
        SandboxPool(Isolation("bwrap"), LIMITS, workers=1)


@needs_bwrap
def test_stdin_and_function_cases_pass_and_fail_by_case():
    pool = SandboxPool(Isolation("bwrap"), LIMITS, workers=2)
    try:
        add = "def add(a, b):\n    return a + b\n"
        assert judge(pool, add, parse_tests(CALLS)).verdict == "passed"
        half = judge(pool, "def add(a, b):\n    return a * b if a == 5 else a + b\n", parse_tests(CALLS))
        assert (half.verdict, half.passed, half.total) == ("wrong_answer", 1, 2) and "expected 0" in half.detail
        stdio = "a, b = map(int, input().split())\nprint(a + b, '  ')\n\n"
        assert judge(pool, stdio, parse_tests(STDIO)).verdict == "passed"
        raises = judge(pool, "def add(a, b):\n    raise KeyError('boom')\n", parse_tests(CALLS))
        assert raises.verdict == "error" and "KeyError" in raises.detail
        # what the program writes to stderr cannot pass for the sandbox failing: it is the program's error
        spoof = judge(pool, "import sys\nsys.stderr.write('bwrap: fake failure\\n')\nsys.exit(1)\n", parse_tests(STDIO))
        assert spoof.verdict == "error"
    finally:
        pool.close()


@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="needs /usr/bin/python3, which any user may run")
def test_the_rlimits_mode_enforces_its_limits_but_does_not_isolate():
    """The weaker mode the docs describe: time and memory held, the environment emptied."""
    pool = SandboxPool(Isolation("rlimits", python="/usr/bin/python3"), LIMITS, workers=1)
    try:
        assert judge(pool, "while True:\n    pass\n", parse_tests(CALLS)).verdict == "timed_out"
        assert judge(pool, "x = bytearray(8 * 1024 ** 3)\n", parse_tests(CALLS)).verdict == "memory_limit"
        env = pool.run({"main.py": "import os\nprint(sorted(os.environ))"}, pool.python("main.py"))
        assert "ROLL" not in env.stdout.decode() and b"HOME" in env.stdout
    finally:
        pool.close()


PARENT_OF_A_SLEEPER = """
import sys
from roll_lite.sandbox import Isolation, Limits, SandboxPool
pool = SandboxPool(Isolation("rlimits", python="/usr/bin/python3"), Limits(wall_s=600.0), workers=1)
pool.run({"main.py": "import time\\ntime.sleep(600)\\n"}, [*pool.python("main.py"), sys.argv[1]])
"""


@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="needs /usr/bin/python3, which any user may run")
def test_the_rlimits_mode_kills_the_program_when_the_worker_dies(tmp_path):
    """No PID namespace dies with the worker there (bwrap's --die-with-parent): a sleeping program
    that only the worker's wall clock would have ended outlived a SIGKILLed worker by its 600 s."""
    marker = f"sleeper-{os.getpid()}-{tmp_path.name}"
    parent = subprocess.Popen([sys.executable, "-c", PARENT_OF_A_SLEEPER, marker])
    program = None
    try:
        deadline = time.monotonic() + 60
        while program is None and time.monotonic() < deadline:
            program = next(iter(processes_running(os.path.realpath("/usr/bin/python3"), marker)), None)
            time.sleep(0.05)
        assert program is not None, "the sandboxed program did not start"
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 3
        while processes_running(os.path.realpath("/usr/bin/python3"), marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not processes_running(os.path.realpath("/usr/bin/python3"), marker), (
            "the program outlived its SIGKILLed worker"
        )
    finally:
        parent.kill()
        parent.wait()
        for pid in processes_running(os.path.realpath("/usr/bin/python3"), marker):
            os.kill(pid, signal.SIGKILL)


def processes_running(program: str, marker: str) -> list[int]:
    """pids (not zombies) whose command line runs `program` with `marker` among its arguments."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, NotADirectoryError, ProcessLookupError, PermissionError):
            continue
        if argv[0] == program.encode() and marker.encode() in argv and state not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids


@needs_bwrap
@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/usr/bin/python3") or shutil.which("setpriv") is None,
    reason="needs root (to become nobody), /usr/bin/python3 and setpriv",
)
def test_the_rootless_mode_isolates_too():
    """As an ordinary user (nobody, here) bwrap runs in a user namespace and RLIMIT_NPROC is counted
    inside it: the pool starts, passes its network check, scores, and stops a fork bomb."""
    tmp_path = Path(tempfile.mkdtemp(prefix="roll_rootless_"))  # pytest's own tmp is root's only
    package = tmp_path / "roll_lite"
    shutil.copytree(REPO / "roll_lite" / "sandbox", package / "sandbox")
    (package / "__init__.py").write_text("")
    subprocess.run(["chmod", "-R", "a+rX", str(tmp_path)], check=True)
    os.chmod(tmp_path, 0o755)
    script = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "from roll_lite.sandbox import *\n"
        "pool = SandboxPool(Isolation('bwrap', python='/usr/bin/python3'), Limits(wall_s=3, cpu_s=2, processes=8), 2)\n"
        f"tests = parse_tests({CALLS!r})\n"
        "print(judge(pool, 'def add(a, b):\\n    return a + b\\n', tests).verdict)\n"
        "print(judge(pool, 'import os\\nwhile True:\\n    try:\\n        os.fork()\\n    except OSError:\\n        pass\\n', tests).verdict)\n"
        "print(pool.run({'m.py': 'import os; print(os.getuid())'}, pool.python('m.py')).stdout.decode().strip())\n"
    )
    try:
        out = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", script],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
    finally:
        shutil.rmtree(tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["passed", "timed_out", "65534"]


def code_reward(**overrides) -> RewardConfig:
    reward = RewardConfig(functions={}, code=1.0, code_extract="whole", **overrides)
    reward.sandbox.wall_s, reward.sandbox.cpu_s, reward.sandbox.workers = 3.0, 2, 2
    return reward


@needs_bwrap
def test_the_reward_worker_scores_programs_with_their_verdicts_in_the_metrics():
    worker = RewardWorker(code_reward())
    try:
        responses = [
            "def add(a, b):\n    return a + b\n",
            "def add(a, b):\n    return a * b if a == 5 else a + b\n",
            "while True:\n    pass\n",
            "   ",
        ]
        scores, scored, metrics = worker.score(responses, [""] * 4, [{"tests": CALLS}] * 4)
        assert scores.tolist() == [1.0, 0.5, 0.0, 0.0] and scored.all()  # a program's failure is its score
        assert metrics["reward/code/programs/passed"] == 1 and metrics["reward/code/programs/wrong_answer"] == 1
        assert metrics["reward/code/programs/timed_out"] == 1 and metrics["reward/code/programs/no_code"] == 1
        assert metrics["reward/code/failed"] == 0 and metrics["reward/unscored"] == 0
        assert worker.describe()[0].startswith("code reward: sandbox bwrap, 2 at once")
    finally:
        worker.close()


@needs_bwrap
def test_the_sandbox_failing_leaves_the_response_unscored_not_zero(monkeypatch):
    worker = RewardWorker(code_reward(code_score="all"))
    try:

        def broken(pool, code, tests):
            raise SandboxError("bwrap did not start the program: out of memory")

        monkeypatch.setattr(code_source, "judge", broken)
        scores, scored, metrics = worker.score(["def add(a, b): return a + b"], [""], [{"tests": CALLS}])
        assert not scored.any() and metrics["reward/code/failed"] == 1 and metrics["reward/unscored"] == 1
    finally:
        worker.close()


def test_rows_with_bad_tests_stop_the_run_naming_file_row_and_key(tmp_path):
    path = tmp_path / "code.jsonl"
    rows = [{"prompt": "add", "answer": "", "tests": CALLS}, {"prompt": "add", "answer": "", "tests": {"cases": []}}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    data = load_config(None, [f"data.train_files={path}"]).data
    reward = RewardConfig(functions={}, code=1.0)
    with pytest.raises(DataError, match=r"code.jsonl.*row 1.*key 'tests': the tests must be an object"):
        prepare_datasets(data, build_char_tokenizer(), row_check=code_row_check(reward, "domain"))
    routed = RewardConfig(
        domains={"code": DomainRewardConfig(code=1.0), "chat": DomainRewardConfig(functions={"format": 1})}
    )
    check = code_row_check(routed, "domain")
    check({"domain": "chat"})  # rows of other domains need no tests
    with pytest.raises(ValueError, match="key 'tests': missing"):
        check({"domain": "code"})
    assert code_row_check(RewardConfig(), "domain") is None


@pytest.mark.parametrize(
    "override, message",
    [
        (["reward.code=1.0", "reward.code_extract=markdown"], "reward.code_extract"),
        (["reward.code=1.0", "reward.code_score=half"], "reward.code_score"),
        (["reward.code=1.0", "reward.sandbox.memory_mb=0"], "reward.sandbox: sandbox limit memory_mb"),
        (["reward.code=1.0", "reward.sandbox.isolation=docker"], "reward.sandbox.isolation"),
        (["reward.code=1.0", "reward.in_driver=true"], "the code sandbox run in the reward worker"),
    ],
)
def test_code_settings_are_checked_before_the_run(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["reward.functions={}", *override])


def test_the_code_source_runs_in_a_reward_worker():
    assert load_config(None, ["reward.code=1.0", "reward.sandbox.isolation=rlimits"]).reward.in_driver is False
    assert load_config(None, []).reward.in_driver is True


@pytest.mark.skipif(os.geteuid() != 0, reason="sandbox uids are claimed as root only")
def test_two_pools_on_one_machine_never_share_a_sandbox_uid():
    """RLIMIT_NPROC counts per uid: one run's fork bomb must not starve another run's programs."""
    from roll_lite.sandbox.users import SANDBOX_UIDS, SandboxUsers

    first, second = SandboxUsers(3), SandboxUsers(2)
    try:
        assert len(set(first.uids + second.uids)) == 5 and all(uid in SANDBOX_UIDS for uid in first.uids + second.uids)
        claimed = first.uids
        first.release()
        third = SandboxUsers(3)  # released uids are free again
        assert sorted(third.uids) == sorted(claimed)
        third.release()
    finally:
        first.release()
        second.release()
