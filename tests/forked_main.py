"""`python SCRIPT ARGS` or `python -c CODE ARGS` without a new interpreter's imports: the code runs as __main__ in
a process forked from multiprocessing's forkserver (the spawned ranks' server, tests/spawned_ranks.py), which
imported torch, transformers and roll_lite's strategy once per pytest process. A new interpreter spends ~5 CPU s
on them (benchmarks/cuda_check.py --smoke --sections kernels, 2026-11-29: 5.3 CPU s started anew, 0.2 forked);
the server's own start, where no test of the pytest process started it before, costs about as much as one.

The code gets what a new interpreter would give it: __main__, sys.argv, sys.path (the script's folder, or the
cwd for -c, then the installed packages' folders), its cwd and environment, none of the tests' modules imported
(what it imports from the tree it finds through its own sys.path), stdout and stderr of its own, SystemExit's
code as its return code, a traceback on stderr for an exception, the atexit functions at its end. What a fork
shares that a new interpreter would not: the import-time state of what the server imported (torch,
transformers, roll_lite's installed package)."""

from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import traceback
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_as_main(
    args: list[str], cwd, timeout: int = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """args as after `python`: [SCRIPT, *argv] or ["-c", CODE, *argv]; env: its environment (None: this process's);
    text stdout and stderr, as subprocess.run's (return code -9: killed after `timeout` seconds)."""
    # the spawned ranks' list (the first caller's is the server's): one server for both
    multiprocessing.set_forkserver_preload(
        ["torch", "transformers", "roll_lite.model.modeling", "roll_lite.strategy.fsdp2", __name__]
    )
    with tempfile.TemporaryDirectory() as folder:
        environment = dict(os.environ if env is None else env)
        child = multiprocessing.get_context("forkserver").Process(
            target=_main, args=(args, str(cwd), environment, folder)
        )
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
        out, err, code = (_read(Path(folder, name)) for name in ("stdout", "stderr", "returncode"))
    returncode = int(code) if child.exitcode == 0 else child.exitcode
    return subprocess.CompletedProcess(args, returncode, out, err)


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""  # a child killed before it wrote the file


def _main(args: list[str], cwd: str, env: dict[str, str], folder: str) -> None:
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    code = args[1] if args[0] == "-c" else None
    sys.argv = ["-c", *args[2:]] if code is not None else list(args)
    first = "" if code is not None else os.path.dirname(os.path.abspath(args[0]))
    sys.path[:] = [first] + [p for p in sys.path if p.startswith((sys.prefix, sys.base_prefix))]
    installed = (str(ROOT / "roll_lite"), sys.prefix)  # roll_lite is installed (editable); the rest of the tree is not
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        if path.startswith(str(ROOT)) and not path.startswith(installed):
            del sys.modules[name]
    returncode = 0
    with open(os.path.join(folder, "stdout"), "w") as out, open(os.path.join(folder, "stderr"), "w") as err:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            if code is None:
                runpy.run_path(args[0], run_name="__main__")
            else:
                main = types.ModuleType("__main__")
                sys.modules["__main__"] = main
                exec(compile(code, "<string>", "exec"), main.__dict__)
        except SystemExit as exit:
            if isinstance(exit.code, int) or exit.code is None:
                returncode = exit.code or 0
            else:
                print(exit.code, file=sys.stderr)
                returncode = 1
        except BaseException:
            traceback.print_exc()
            returncode = 1
        atexit._run_exitfuncs()  # the process ends with os._exit: what the interpreter would run at its exit
        sys.stdout.flush()
        sys.stderr.flush()
    Path(folder, "returncode").write_text(str(returncode))
