"""The CPU build of torch for scripts/setup.sh: which pip arguments ask for it, and whether it is what got installed.

    python scripts/cpu_torch.py pip-args [--index-reachable yes|no]   # prints the `pip install` arguments
    python scripts/cpu_torch.py check [--pip-args ARGS]              # exit 1, with one line, unless torch is CPU

A bare `pip install torch==2.13.0` takes whatever pip's configuration points at; on a machine set up for
the package index that is the CUDA build and several GB of CUDA packages. So `pip-args` asks for the CPU
build by its local version label, `torch==2.13.0+cpu`: no CUDA wheel can satisfy that, wherever pip looks.
Where PyTorch's CPU index (its install page's https://download.pytorch.org/whl/cpu) answers within 3 s, it is
the `--index-url`: that replaces pip's default index, so torch's dependencies come from it too, while the
find-links and extra indexes in pip's configuration stay. (`--extra-index-url` would keep the default index
beside it, with no priority between the two.) Where it does not answer, pip's configuration alone is asked
(find-links or an index holding CPU wheels, as on machines without the internet). The probe bounds that
detour to 3 s; pip alone, sent to an index it cannot reach, retries it 5 times before going on (measured: 9 s
for a host name that does not resolve; 27 s for a connection that hangs, with --timeout 3, so some 18 min at
a 180 s timeout). The version comes from constraints-cpu.txt, which guards every later install. Standard
library only: it runs before torch, and before roll_lite, is installed.
"""

from __future__ import annotations

import argparse
import re
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROBE_TIMEOUT_S = 3.0


def torch_version(constraints: Path = REPO / "constraints-cpu.txt") -> str:
    """The torch release every CPU install is held to (constraints-cpu.txt's `torch==X`)."""
    found = re.search(r"^torch==([\w.]+)\s*$", constraints.read_text(), re.M)
    if not found:
        raise SystemExit(f"cpu_torch.py: {constraints} pins no `torch==VERSION`")
    return found[1]


def index_answers(url: str = CPU_INDEX + "/torch/", timeout: float = PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """Whether `url` answers with a success status within `timeout` seconds in all, and if not, why.

    The request runs in a daemon thread that is abandoned at the deadline: a socket timeout alone does not
    bound a slow DNS lookup."""
    outcome: list[str] = []

    def request() -> None:
        try:
            with urllib.request.urlopen(url, timeout=timeout):  # an error status raises HTTPError
                outcome.append("")
        except Exception as error:  # any failure means: do not send pip there
            outcome.append(f"{type(error).__name__}: {error}")

    thread = threading.Thread(target=request, daemon=True)
    thread.start()
    thread.join(timeout)
    if not outcome:
        return False, f"no answer within {timeout:g} s"
    return outcome[0] == "", outcome[0]


def pip_args(index_reachable: bool, version: str) -> list[str]:
    """`pip install` arguments for torch's CPU build: from PyTorch's CPU index, or from pip's configuration."""
    requirement = f"torch=={version}+cpu"
    return [requirement, "--index-url", CPU_INDEX] if index_reachable else [requirement]


def torch_problem(torch, version: str) -> str | None:
    """What is wrong with the imported `torch` for a CPU set-up held to `version`, or None."""
    for accelerator, built in (("CUDA", torch.version.cuda), ("ROCm", getattr(torch.version, "hip", None))):
        if built:
            return f"torch {torch.__version__} is a {accelerator} {built} build, not the CPU build of torch {version}"
    if torch.__version__.split("+")[0] != version:
        return f"torch {torch.__version__} is installed, not torch {version} (CPU)"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    choose = commands.add_parser("pip-args", help="print the pip install arguments for torch's CPU build")
    choose.add_argument("--index-reachable", choices=["yes", "no"], help="skip the probe of " + CPU_INDEX)
    check = commands.add_parser("check", help="exit 1, naming the fix, unless the installed torch is the CPU build")
    check.add_argument("--pip-args", help="what pip-args printed (the fix it names reinstalls with them)")
    args = parser.parse_args(argv)
    version = torch_version()

    if args.command == "pip-args":
        if args.index_reachable:
            reachable, why = args.index_reachable == "yes", "--index-reachable no"
        else:
            start = time.monotonic()
            reachable, why = index_answers()
            why = f"{why}; {time.monotonic() - start:.1f} s"
        source = CPU_INDEX if reachable else f"pip's configuration ({CPU_INDEX} unreachable: {why})"
        print(f"setup.sh: torch {version}+cpu from {source}", file=sys.stderr)
        print(" ".join(pip_args(reachable, version)))
        return 0

    try:
        import torch
    except Exception as error:  # a CUDA build without its libraries raises OSError, say
        problem: str | None = f"torch does not import ({type(error).__name__}: {error})"
    else:
        problem = torch_problem(torch, version)
    if problem is None:
        print(f"torch ok: {torch.__version__}, the CPU build")
        return 0
    reinstall = args.pip_args or " ".join(pip_args(True, version))
    fix = f".venv/bin/python -m pip install --force-reinstall --no-deps {reinstall}"
    print(f"setup.sh: {problem}; fix: {fix}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
