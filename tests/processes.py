"""Process trees from /proc, for tests that check which processes a run started and left behind; and
waiting for a process started in the background to listen on its port."""

import socket
import subprocess
import time
from pathlib import Path


def descendants(pid: int) -> set[int]:
    """Every live process under `pid`; a Ray worker forked from the workers' zygote (tests/warm_workers.py)
    counts as its launcher's child, which is where a worker started anew would be."""
    from warm_workers import launched_worker

    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for child in children.get(parent, []) + [w for w in [launched_worker(parent)] if w is not None]:
            found.add(child)
            todo.append(child)
    return found


def wait_until_listening(port: int, process: subprocess.Popen, what: str, timeout: float = 120) -> None:
    """Until something accepts connections on 127.0.0.1:`port`, while `process` runs. For a `ray start
    --head`: its GCS (Ray's clients wait for its raylet themselves); polling `ray status` instead costs
    ~1.5 s of CPU a call."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline and process.poll() is None, f"{what} did not start"
            time.sleep(0.2)


def found_lines(script: Path, names: list[str], cwd: Path) -> tuple[dict, str]:
    """Run a checks script (tests/vllm_checks.py, tests/test_vllm_lora.py) for `names` and gather the JSON of
    its `FOUND ` lines: ({name: findings}, its stderr)."""
    import json
    import sys

    result = subprocess.run([sys.executable, str(script), *names], capture_output=True, text=True, timeout=600, cwd=cwd)
    lines = [line[len("FOUND ") :] for line in result.stdout.splitlines() if line.startswith("FOUND ")]
    return {name: found for line in lines for name, found in json.loads(line).items()}, result.stderr
