"""Ray workers that skip their imports: forked from a zygote of their own (tests/warm_driver.py starts it).

Ray's raylet starts a worker as `python setup_worker.py default_worker.py ARGS`, which execs bash, which
execs `python default_worker.py ARGS`, which imports Ray and then, for a roll_lite actor, roll_lite, torch and
transformers: about 3 s of CPU per worker process, and a test run's cluster starts two or three. The drivers'
zygote forks, before its own imports, the workers' zygote (`fork_zygote`), which imports PRELOAD at its first
request: what the workers need, but Ray, which reads its settings (the job's id, the raylet's pid) from the
environment once, at its import. In the drivers' zygote `install` sets RayParams.setup_worker_path to this file, so a forked
roll-train's local cluster runs `python tests/warm_workers.py ARGS` for each worker: a launcher that imports
nothing heavy and asks the workers' zygote, over the socket in $ROLL_TEST_WARM_WORKERS, for a fork. The fork
becomes the worker (`become_worker`): its own session, the launcher's stdin/stdout/stderr, cwd and
environment, `default_worker.py ARGS` run as `__main__` on the sys.path a fresh worker would have; it
imports Ray then (~0.3 s of CPU). The launcher stays as the process the raylet started: it passes on
SIGTERM, SIGINT and SIGHUP, and exits as the worker did; a launcher killed outright takes the worker with it
(the worker reads a pipe that only the launcher holds open, and ends at its end of file).

What the zygote cannot honour starts the usual way, the launcher exec'ing Ray's own setup_worker.py
(`why_cold` says why; ROLL_TEST_WARM_DRIVER_LOG gets a line): an environment that differs from the zygote's
beyond Ray's variables, a folder on $PYTHONPATH that holds a module the zygote imported from elsewhere, a
runtime_env that sets variables, a prefix or another interpreter, or interpreter flags. Only clusters
started by a forked roll-train are concerned: a fresh process (a reference run, a `ray start` head, a
benchmark script) starts its workers as Ray does. `ROLL_TEST_WARM_WORKERS=0` turns it off.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
from importlib.util import find_spec
from pathlib import Path

SOCKET_VARIABLE = "ROLL_TEST_WARM_WORKERS"
LAUNCHER = str(Path(__file__).resolve())
STATUS = struct.Struct("i")  # a wait status, as the zygotes write it (tests/warm_driver.py _serve)
# What a run's Ray workers import, Ray itself left out: it reads its settings (the job's id, the raylet's
# pid, ...) from the environment once, at its import, and each worker's differs. A worker then imports Ray
# (~0.3 s of CPU) and the modules of its actor class, on top of these.
PRELOAD = (
    "transformers",
    "roll_lite.model.modeling",
    "roll_lite.model.attention",
    "roll_lite.rollout.hf",
    "roll_lite.strategy",
    "roll_lite.loss",
    "roll_lite.rewards.runner",
    "roll_lite.environments.runner",
    "transformers.models.auto.modeling_auto",
    "transformers.models.qwen2.modeling_qwen2",
)
# Ray's name for the variable that names a runtime_env's worker_process_setup_hook, which its setup_worker.py
# puts in the worker's environment (ray._private.ray_constants; tests/ray_hosts.py checks it without this
# launcher importing Ray): a joined cluster's launcher (tests/host_launcher.py) does the same
SETUP_HOOK_VARIABLE = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"
# What may differ from the zygote's environment: read by Ray (imported in the worker) and at run time
READ_AFTER_THE_FORK = ("PYTHONBREAKPOINT", "SPT_NOENV", SOCKET_VARIABLE, SETUP_HOOK_VARIABLE)
DEFAULT_WORKER = "_private/workers/default_worker.py"
LAUNCHED = Path(tempfile.gettempdir(), "roll_warm_launched")  # a file per launcher: its pid, holding its worker's


def ray_file(relative: str) -> str:
    spec = find_spec("ray")  # the package's place, without importing it
    assert spec is not None and spec.origin is not None
    return str(Path(spec.origin).parent / relative)


def setup_worker_arguments(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Ray's setup_worker.py's own two arguments, and the rest: `default_worker.py ARGS`."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--serialized-runtime-env-context", default=None)
    parser.add_argument("--language", default=None)
    return parser.parse_known_args(argv)


# ---- in the zygotes (tests/warm_driver.py) ----------------------------------------------------------


def install(socket_path: str) -> None:
    """In the drivers' zygote: local clusters started by its forks launch their workers through this file
    (ray.init builds a RayParams, and Node fills in setup_worker_path only where it is unset)."""
    import ray._private.parameter as parameter

    plain_init = parameter.RayParams.__init__

    def init(self, *args, **kwargs) -> None:
        plain_init(self, *args, **kwargs)
        if self.setup_worker_path is None:
            self.setup_worker_path = LAUNCHER

    parameter.RayParams.__init__ = init


def listen(folder: str) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(folder, "workers.sock"))  # a path, not an abstract name: hosts in namespaces reach it
    listener.listen(16)
    return listener


_held: list[socket.socket] = []


def fork_zygote(pytest: socket.socket, start_path: list[str], start_env: dict[str, str], zygote) -> str:
    """In the drivers' zygote, before its imports: forks the workers' zygote, which imports PRELOAD at its
    first request (the drivers' zygote does not: a driver imports no model classes), and returns the path
    of its socket. `zygote`: the module of tests/warm_driver.py (its `__main__` there), whose request loop and
    checks it uses. It serves until the drivers' zygote ends; each of its children becomes a worker."""
    folder = tempfile.mkdtemp(prefix="roll_warm_")
    listener = listen(folder)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.fork():
        listener.close()
        theirs.close()
        _held.append(ours)  # the workers' zygote leaves when this end closes: when the drivers' zygote ends
        return os.path.join(folder, "workers.sock")
    pytest.close()
    ours.close()
    # its imports, at the first request (many pytest processes' zygotes see none): (state, top-level modules)
    imported: list[tuple[str, set[str]]] = []

    def cold(request: dict) -> str | None:
        if not imported:
            state = zygote._preload(PRELOAD)
            if "ray" in sys.modules:  # Ray would have read its settings from this process's environment
                state = "not forking: the modules imported Ray"
            imported.append((state, {name.split(".")[0] for name in sys.modules}))
        state, modules = imported[0]
        if not state.startswith("ready "):
            return state
        return why_cold(request, start_env, zygote._changed, lambda folders: zygote._shadowing(folders, modules))

    child = zygote._serve(theirs, listener, cold)
    if child is None:
        shutil.rmtree(folder, ignore_errors=True)
        os._exit(0)
    become_worker({**child, "start_path": start_path}, zygote._adopt)
    runpy.run_path(sys.argv[0], run_name="__main__")
    sys.exit(0)


def why_cold(request: dict, zygote_env: dict[str, str], changed, shadowed) -> str | None:
    """In the workers' zygote: why a worker cannot be forked (None: it can). `changed(env, zygote_env)` and
    `shadowed(folders)` are the zygote's checks for drivers (tests/warm_driver.py)."""
    env = request["env"]
    different = [k for k in changed(env, zygote_env) if not k.startswith("RAY_") and k not in READ_AFTER_THE_FORK]
    if different:
        return f"its environment differs from the zygote's in {different}"
    args, rest = setup_worker_arguments(request["argv"])
    if args.language != "PYTHON" or not rest or rest[0] != ray_file(DEFAULT_WORKER):
        return f"not a Python worker's command: {request['argv'][:2]}"
    context = json.loads(args.serialized_runtime_env_context or "{}")
    if context.get("env_vars") or context.get("command_prefix") or context.get("override_worker_entrypoint"):
        return "its runtime_env sets variables, a prefix or an entry point"
    if context.get("py_executable") not in (None, sys.executable):
        return f"its runtime_env runs {context['py_executable']}"
    return shadowed([Path(request["cwd"], p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])


def become_worker(request: dict, adopt) -> None:
    """In a fork of the workers' zygote: the worker `python default_worker.py ARGS` would be, but for the
    run itself (`runpy` of sys.argv[0]). `adopt(request, first_path_entry)` takes on the request's cwd,
    environment, stdio and sys.path (tests/warm_driver.py)."""
    os.setsid()  # as the raylet's workers: a group of their own, apart from pytest's
    status_write, alive = request["fds"][3:5]
    os.close(status_write)  # the zygote's to write
    threading.Thread(target=_end_with_the_launcher, args=(alive,), daemon=True).start()
    rest = setup_worker_arguments(request["argv"])[1]
    adopt(request, os.path.dirname(rest[0]))
    sys.argv = rest


def _end_with_the_launcher(alive: int) -> None:
    while os.read(alive, 1):
        pass
    os.kill(os.getpid(), signal.SIGKILL)  # the raylet's process is gone: so is its worker


# ---- the launcher: run by the raylet as `python tests/warm_workers.py ARGS` ------------------------------


def _ask_for_a_fork(path: str) -> tuple[int, int] | str:
    """(the worker's pid, the read end of its status pipe), or why the zygote did not fork."""
    status_read, status_write = os.pipe()
    alive_read, alive_write = os.pipe()  # alive_write stays open here until this process ends
    request = json.dumps({"kind": "worker", "argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)})
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(path)
            socket.send_fds(connection, [request.encode() + b"\n"], [0, 1, 2, status_write, alive_read])
            reply = connection.makefile().readline().strip()
    except OSError as error:
        reply = f"no zygote at {path}: {error}"
    finally:
        os.close(status_write)
        os.close(alive_read)
    if not reply.isdigit():
        os.close(status_read)
        os.close(alive_write)
        return reply or "the zygote went away"
    return int(reply), status_read


def launched_worker(pid: int) -> int | None:
    """The worker a launcher of pid `pid` got forked, if it is one that did (for tests/processes.py)."""
    try:
        if LAUNCHER.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return None
        return int((LAUNCHED / str(pid)).read_text())
    except (OSError, ValueError):
        return None


def _log(line: dict) -> None:
    if log := os.environ.get("ROLL_TEST_WARM_DRIVER_LOG"):
        with open(log, "a") as file:
            file.write(json.dumps(line) + "\n")


def launch() -> None:
    path = os.environ.get(SOCKET_VARIABLE)
    forked = _ask_for_a_fork(path) if path else f"no ${SOCKET_VARIABLE}"
    if isinstance(forked, str):
        _log({"worker": "cold", "not_forked": forked})
        setup_worker = ray_file("_private/workers/setup_worker.py")
        os.execv(sys.executable, [sys.executable, setup_worker, *sys.argv[1:]])
    pid, status_read = forked
    _log({"worker": pid, "not_forked": None})
    LAUNCHED.mkdir(exist_ok=True)
    (LAUNCHED / str(os.getpid())).write_text(str(pid))
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda signum, _: os.kill(pid, signum))
    data = b""
    while len(data) < STATUS.size:
        part = os.read(status_read, STATUS.size - len(data))
        if not part:
            os._exit(255)  # the zygote went first (its pytest process is ending)
        data += part
    status = STATUS.unpack(data)[0]
    (LAUNCHED / str(os.getpid())).unlink(missing_ok=True)
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 255)


if __name__ == "__main__":
    launch()
