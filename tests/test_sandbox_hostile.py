"""The hostile-code suite: programs that attack the sandbox, each scored 0 with a named verdict while
the batch goes on and the machine stays healthy (no process, file or disk left behind).

All programs run as one batch through one pool, as a step's responses would; each test then reads
its program's verdict. Programs that try to escape (read a secret, reach a server, write outside)
are asked to *return* what they got, with the secret as the expected value: a pass would mean an
escape.
"""

from __future__ import annotations

import os
import shutil
import socket
import string
import tempfile
import threading
from pathlib import Path

import pytest

from roll_lite.sandbox import Isolation, Limits, SandboxPool, judge, parse_tests
from roll_lite.sandbox.users import SANDBOX_UIDS

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed (scripts/setup.sh installs it as root)"
)

REPO = Path(__file__).resolve().parents[1]
SECRET = "roll-secret-4f1c9e"
LIMITS = Limits(wall_s=3.0, cpu_s=2, memory_mb=512, file_mb=8, disk_mb=16, processes=12, output_kb=256)
CALLS = {"function": "f", "cases": [{"args": [x], "expected": x * 7919 % 10007} for x in (3, 58, 911)]}
STDIO = {"cases": [{"stdin": f"{x}\n", "stdout": f"{x * 7919 % 10007}\n"} for x in (3, 58)]}


def secret_tests() -> dict:
    return {"function": "f", "cases": [{"args": [], "expected": SECRET}]}


HOSTILE = {
    # name: (program, tests, the verdicts it may get)
    "infinite_loop": ("while True:\n    pass\n", CALLS, {"timed_out"}),
    "fork_bomb": (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        CALLS,
        {"timed_out"},
    ),
    "allocate_20_gb": ("block = bytearray(20 * 1024 ** 3)\ndef f(x):\n    return 0\n", CALLS, {"memory_limit"}),
    "write_10_gb_file": (
        "with open('big', 'wb') as out:\n    for _ in range(10 * 1024):\n        out.write(b'x' * 2 ** 20)\n",
        CALLS,
        {"error"},
    ),
    "fill_the_disk": (
        "for i in range(10000):\n    open(f'/tmp/f{i}', 'wb').write(b'x' * 4 * 2 ** 20)\n",
        CALLS,
        {"error"},
    ),
    "write_outside": (
        "import os\nfor path in $paths:\n    try:\n        os.makedirs(os.path.dirname(path), exist_ok=True)\n"
        "        open(path, 'w').write('pwned')\n    except OSError:\n        pass\ndef f():\n    return 'wrote'\n",
        secret_tests(),
        {"wrong_answer"},
    ),
    "read_parent_env_and_files": (
        "import os\ndef f():\n    seen = str(dict(os.environ))\n    for path in $paths:\n"
        "        try:\n            seen += open(path).read()\n        except OSError:\n            pass\n"
        "    return '$secret' if '$secret' in seen else seen[:50]\n",
        secret_tests(),
        {"wrong_answer"},
    ),
    "open_socket": (
        "import socket\ndef f():\n    try:\n        with socket.create_connection(('127.0.0.1', $port), timeout=1) as s:\n"
        "            return s.recv(100).decode()\n    except OSError as e:\n        return str(e)\n",
        secret_tests(),
        {"wrong_answer"},
    ),
    "kill_parent": (
        "import os, signal\nfor pid in (os.getppid(), $parent, -1):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError:\n        pass\ndef f(x):\n    return 0\n",
        CALLS,
        {"wrong_answer"},
    ),
    "flood_stdout": ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", STDIO, {"output_limit"}),
    "flood_stderr": ("import os\nwhile True:\n    os.write(2, b'y' * 65536)\n", STDIO, {"output_limit"}),
    "close_stdout": (
        "import os\nos.close(1)\nos.close(2)\nprint(2 * int(input()))\n",
        STDIO,
        {"error", "wrong_answer"},
    ),
    "sys_exit_first": ("import sys\nsys.exit(0)\ndef f(x):\n    return x * 7919 % 10007\n", CALLS, {"error"}),
    "os_exit_first": ("import os\nos._exit(0)\ndef f(x):\n    return x * 7919 % 10007\n", CALLS, {"error"}),
    "patch_equality": (
        "class Any:\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return Any()\n",
        CALLS,
        {"error"},
    ),
    "patch_builtins_and_json": (
        "import builtins, json\nbuiltins.print = lambda *a, **k: None\n"
        'json.dumps = lambda *a, **k: \'{"case": 0, "value": 1}\'\nfor i in range(3):\n'
        "    __import__('sys').__stdout__.write('{\"case\": %d, \"value\": 12345}\\n' % i)\ndef f(x):\n    return 1\n",
        CALLS,
        {"error", "wrong_answer"},
    ),
    "print_all_tests_passed": ("print('all tests passed')\nprint('OK 3/3')\n", STDIO, {"wrong_answer"}),
    "sleep_holding_child": (
        "import os, time\nif os.fork() == 0:\n    time.sleep(1000)\ntime.sleep(1000)\n",
        CALLS,
        {"timed_out"},
    ),
    "slow_but_correct": (
        "import time\ndef f(x):\n    time.sleep(10)\n    return x * 7919 % 10007\n",
        CALLS,
        {"timed_out"},
    ),
}


def sandbox_processes(uids=SANDBOX_UIDS) -> list[int]:
    """pids whose uid is one of `uids` (default: any sandbox slot's)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                uid = os.stat(f"/proc/{entry}").st_uid
            except FileNotFoundError:
                continue
            if uid in uids:
                pids.append(int(entry))
    return pids


def scratch_dirs(root: str) -> set[str]:
    return {name for name in os.listdir(root) if name.startswith("roll_sandbox_")}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    """{name: Verdict} of the whole hostile batch, and what was left after it.

    Another test process may run sandboxes at the same time (CI run of stop 52: its scratch directory
    came and went during this batch), so the batch's scratch directories go to a temp root of its own
    and only the uids its pool held are checked for processes (a pool's uids are its alone: users.py).
    """
    home = tmp_path_factory.mktemp("hostile")
    secret_file = home / "secret.txt"
    secret_file.write_text(SECRET)
    outside = [
        str(REPO / "pwned_by_sandbox.txt"),
        str(Path(tempfile.gettempdir()) / "pwned_by_sandbox.txt"),
        str(home / "pwned.txt"),
    ]
    os.environ["ROLL_TEST_SECRET_TOKEN"] = SECRET
    server = socket.create_server(("127.0.0.1", 0))
    connections = []

    def serve():
        try:
            while True:
                client, _ = server.accept()
                connections.append(client)
                client.sendall(SECRET.encode())
        except OSError:  # closed at the end
            pass

    threading.Thread(target=serve, daemon=True).start()
    fill = dict(paths=outside, secret=SECRET, port=server.getsockname()[1], parent=os.getpid())
    programs = {}
    for name, (source, tests, _) in HOSTILE.items():
        if name == "read_parent_env_and_files":
            fields = dict(
                fill, paths=[str(secret_file), f"/proc/{os.getpid()}/environ", "/proc/1/environ", "/etc/shadow"]
            )
        else:
            fields = fill
        fields = {key: repr(value) if key == "paths" else value for key, value in fields.items()}
        programs[name] = (string.Template(source).substitute(fields), parse_tests(tests))
    scratch_root = tempfile.mkdtemp(prefix="roll_hostile_")
    os.chmod(scratch_root, 0o755)
    free_before = shutil.disk_usage(scratch_root).free
    pool = SandboxPool(Isolation("bwrap"), LIMITS, workers=2)
    pool_uids = [uid for uid in pool._users.uids if uid is not None]
    tempfile.tempdir = scratch_root
    try:
        results = dict(zip(programs, pool.map(lambda item: judge(pool, *item), list(programs.values()))))
    finally:
        tempfile.tempdir = None
        pool.close()
        server.close()
        del os.environ["ROLL_TEST_SECRET_TOKEN"]
    after = dict(
        processes=sandbox_processes(pool_uids) if pool_uids else [],
        scratch=scratch_dirs(scratch_root),
        grown=free_before - shutil.disk_usage(scratch_root).free,
    )
    shutil.rmtree(scratch_root, ignore_errors=True)
    yield results, after, outside, connections


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_program_scores_zero_with_a_named_verdict(verdicts, name):
    results, _, _, _ = verdicts
    verdict = results[name]
    assert verdict.passed == 0, f"{name} passed {verdict.passed} case(s): {verdict}"
    assert verdict.verdict in HOSTILE[name][2], f"{name}: {verdict}"


def test_nothing_escaped_and_the_machine_is_as_it_was(verdicts):
    results, after, outside, connections = verdicts
    assert not any(os.path.exists(path) for path in outside), "a program wrote outside its sandbox"
    assert connections == [], "a program reached a server on the host's loopback"
    assert after["processes"] == [], "a sandboxed process outlived its run"
    assert after["scratch"] == set(), "a run left its scratch directory behind"
    assert after["grown"] < 64 * 2**20, f"the disk lost {after['grown'] / 2**20:.0f} MB during the hostile batch"


def test_a_good_program_still_passes_after_the_hostile_batch(verdicts):
    pool = SandboxPool(Isolation("bwrap"), LIMITS, workers=1)
    try:
        verdict = judge(pool, "def f(x):\n    return x * 7919 % 10007\n", parse_tests(CALLS))
    finally:
        pool.close()
    assert (verdict.verdict, verdict.passed) == ("passed", 3)
