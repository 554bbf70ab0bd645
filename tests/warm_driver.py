"""roll-train processes that skip the driver's imports: forked from a process that has imported them.

A `roll-train` driver spends about a third of a tiny end-to-end run's CPU importing torch, transformers
and Ray before it reads its config (~4.5 s of ~14 s, scripts/suite_cpu.py). `WarmPopen` is a
`subprocess.Popen` that starts `python -m roll_lite.cli ARGS` as a fork of a zygote instead: a process,
one per pytest process, that imported the driver's modules once and then only forks. The child is a new
process of its own (its own pid, stdin/stdout/stderr, cwd, environment, session where asked), runs
roll-train's `__main__` as `python -m roll_lite.cli` would, and exits as an interpreter does (atexit,
threads joined, streams flushed). Signals, process groups, pipes, `wait`, `communicate`, `kill` are
Popen's own.

What a fork shares that a fresh interpreter would not: the modules' import-time state, taken with the
zygote's environment, and the zygote's hash seed. So a command is forked only when it is
`<python> -m roll_lite.cli ...`, its environment differs from the zygote's in `$PYTHONPATH`,
`ROLL_LITE_TEST_*` and pytest's `PYTEST_CURRENT_TEST` alone (the last two read at run time, if at all),
and neither its cwd nor a `$PYTHONPATH` folder holds a module of a name the zygote imported (a fresh
process would import that one instead); anything else starts the usual way. Tests that compare runs
bit for bit keep their reference run a fresh process, so that the comparison still spans two processes
started apart.
The Ray workers of a forked run's local cluster are forked too, from a second zygote this one forks
before its imports (tests/warm_workers.py).
`ROLL_TEST_WARM_DRIVER=0` turns both off; `ROLL_TEST_WARM_DRIVER_LOG=FILE` appends a line per start to FILE,
forked or why not. CONTRIBUTING.md ("The CI budget") has the measurement.
"""

from __future__ import annotations

import atexit
import gc
import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import warm_workers

REPO = Path(__file__).resolve().parents[1]
# what the driver imports before and while it starts Ray (the modules a tiny run had imported at its end)
PRELOAD = (
    "roll_lite.cli",
    "roll_lite.pipelines.ppo",
    "roll_lite.pipelines.sft",
    "roll_lite.workers.group",
    "roll_lite.workers.cluster",
    "ray.dashboard.optional_deps",
    "ray.util.state",
)
STATUS = warm_workers.STATUS  # a wait status, as the zygote writes it for whoever waits on a fork
FORKABLE_CHANGES = ("PYTHONPATH", "PYTEST_CURRENT_TEST")  # and ROLL_LITE_TEST_*: read at run time, if at all


class _Zygote:
    """The pytest side: one zygote per pytest process, started on first use."""

    def __init__(self) -> None:
        self.env = dict(os.environ)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.process = subprocess.Popen(
            [sys.executable, __file__, str(theirs.fileno())], pass_fds=[theirs.fileno()], cwd=REPO, env=self.env
        )
        theirs.close()
        self.socket, self.lock = ours, threading.Lock()
        self.state = self._reply()  # "ready MODULES", or why it does not fork
        self.ready, self.modules = self.state.startswith("ready "), set(self.state[6:].split(","))
        atexit.register(self.stop)

    def _reply(self) -> str:
        data = b""
        while not data.endswith(b"\n"):
            part = self.socket.recv(4096)
            if not part:
                return "gone"
            data += part
        return data.decode().strip()

    def fork(self, argv: list[str], cwd: str, env: dict[str, str], fds: list[int], new_session: bool) -> int | None:
        request = json.dumps({"argv": argv, "cwd": cwd, "env": env, "new_session": new_session}).encode() + b"\n"
        with self.lock:
            socket.send_fds(self.socket, [request], fds)
            reply = self._reply()
        return int(reply) if reply.isdigit() else None

    def stop(self) -> None:
        atexit.unregister(self.stop)
        self.socket.close()  # the zygote leaves when its socket closes; forked runs go on
        self.process.wait(timeout=30)


_zygote: _Zygote | None = None


def _the_zygote() -> _Zygote | None:
    """The zygote of this process's environment, started on first use and again when a test changed
    that environment for good (an in-process worker sets RANK, ...); None where it does not fork (its
    state says why)."""
    global _zygote
    if os.environ.get("ROLL_TEST_WARM_DRIVER", "1") == "0":
        return None
    if _zygote is not None and (_changed(dict(os.environ), _zygote.env) or _zygote.process.poll() is not None):
        _zygote.stop()
        _zygote = None
    if _zygote is None:
        _zygote = _Zygote()
    return _zygote if _zygote.ready else None


def _changed(env: dict[str, str], zygote_env: dict[str, str]) -> list[str]:
    """The variables of `env` that a fork could not honour: all but $PYTHONPATH, `ROLL_LITE_TEST_*` and
    `PYTEST_CURRENT_TEST` must be the zygote's."""
    changed = {k for k in env.keys() | zygote_env.keys() if env.get(k) != zygote_env.get(k)}
    return sorted(k for k in changed if not k.startswith("ROLL_LITE_TEST_") and k not in FORKABLE_CHANGES)


def _why_not_forked(cwd, env, zygote: _Zygote) -> str | None:
    env = dict(os.environ if env is None else env)
    if changed := _changed(env, zygote.env):
        return f"its environment differs from the zygote's in {changed}"
    return _shadowing([Path(cwd or os.getcwd()), *map(Path, _python_path(env))], zygote.modules)


def _shadowing(folders: list[Path], modules: set[str]) -> str | None:
    """A folder first on a child's sys.path must not hold a module the zygote imported from elsewhere."""
    for folder in (f.resolve() for f in folders):
        if folder != REPO and folder.is_dir():
            if shadowing := sorted({n.removesuffix(".py") for n in os.listdir(folder)} & modules):
                return f"{folder} holds {shadowing}, which the zygote imported from elsewhere"
    return None


def _python_path(env: dict[str, str]) -> list[str]:
    """$PYTHONPATH's entries as a fresh interpreter puts them on sys.path (an empty one is the cwd)."""
    value = env.get("PYTHONPATH", "")
    return [os.path.abspath(entry) for entry in value.split(os.pathsep)] if value else []


class WarmPopen(subprocess.Popen):
    """subprocess.Popen; `python -m roll_lite.cli ...` is forked from the zygote where it can be (above)."""

    _status_fd: int | None = None
    not_forked_because: str | None = None

    def _execute_child(self, *popen_args):  # Popen's own arguments, as Python 3.11's POSIX Popen passes them
        (args, executable, preexec_fn, close_fds, pass_fds, cwd, env, _, _, shell, p2cread, p2cwrite, c2pread,
         c2pwrite, errread, errwrite, _, gid, gids, uid, umask, start_new_session, process_group) = popen_args  # fmt: skip
        plain = not shell and executable is None and preexec_fn is None and close_fds and not pass_fds
        plain = plain and gid is None and gids is None and uid is None and umask < 0 and process_group == -1
        if not plain:
            self.not_forked_because = "Popen options that a fork does not take"
        elif [str(a) for a in args[:3]] != [sys.executable, "-m", "roll_lite.cli"]:
            self.not_forked_because = "not `python -m roll_lite.cli`"
        elif (zygote := _the_zygote()) is None:
            self.not_forked_because = f"no zygote: {_zygote.state if _zygote else 'ROLL_TEST_WARM_DRIVER=0'}"
        else:
            self.not_forked_because = _why_not_forked(cwd, env, zygote)
        if log := os.environ.get("ROLL_TEST_WARM_DRIVER_LOG"):  # a JSON line per start: forked, or why not
            with open(log, "a") as file:
                file.write(
                    json.dumps({"args": [str(a) for a in args][:6], "not_forked": self.not_forked_because}) + "\n"
                )
        if self.not_forked_because is not None:
            return super()._execute_child(*popen_args)
        status_read, status_write = os.pipe()
        stdio = [fd if fd != -1 else default for fd, default in ((p2cread, 0), (c2pwrite, 1), (errwrite, 2))]
        try:
            pid = zygote.fork(
                [str(a) for a in args[3:]],
                os.path.abspath(cwd or os.getcwd()),
                dict(os.environ if env is None else env),
                [*stdio, status_write],
                start_new_session,
            )
        finally:
            os.close(status_write)
        if pid is None:
            os.close(status_read)
            raise OSError(f"the roll-train zygote could not fork {args}")
        self.pid, self._child_created, self._status_fd = pid, True, status_read
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _try_wait(self, wait_flags):
        if self._status_fd is None:
            return super()._try_wait(wait_flags)
        if wait_flags & os.WNOHANG and not select.select([self._status_fd], [], [], 0)[0]:
            return (0, 0)
        data = os.read(self._status_fd, STATUS.size)
        os.close(self._status_fd)
        self._status_fd = -1
        # no status: the zygote went first (the pytest process is ending); call it exit code 255
        return (self.pid, STATUS.unpack(data)[0] if len(data) == STATUS.size else 255 << 8)

    def _internal_poll(self, _deadstate=None, _waitpid=None, _WNOHANG=None, _ECHILD=None):
        if self._status_fd is None:
            return super()._internal_poll(_deadstate)
        if self.returncode is None and self._waitpid_lock.acquire(False):
            try:
                if self.returncode is None and self._status_fd != -1:
                    pid, status = self._try_wait(os.WNOHANG)
                    if pid == self.pid:
                        self._handle_exitstatus(status)
            finally:
                self._waitpid_lock.release()
        return self.returncode


def run(
    args, *, fresh=False, timeout=None, check=False, input=None, capture_output=False, **kwargs
) -> subprocess.CompletedProcess:
    """subprocess.run with WarmPopen; with `fresh`, subprocess.run itself: a process started anew."""
    if fresh:
        return subprocess.run(args, timeout=timeout, check=check, input=input, capture_output=capture_output, **kwargs)
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    with WarmPopen(args, stdin=subprocess.PIPE if input is not None else None, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except BaseException:
            process.kill()
            raise
    if check and process.returncode:
        raise subprocess.CalledProcessError(process.returncode, args, stdout, stderr)
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)


def roll_train(argv: list[str], cwd, fresh: bool = False) -> subprocess.CompletedProcess:
    """A docs' `roll-train ARGS` line (split) as `python -m roll_lite.cli ARGS` in `cwd`, to its end, which
    must be a success; warm, or with `fresh` a process started anew."""
    command = [sys.executable, "-m", "roll_lite.cli", *argv[1:]]
    result = run(command, fresh=fresh, capture_output=True, text=True, timeout=600, cwd=cwd)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


# ---- the zygote: run as `python tests/warm_driver.py FD` with cwd = the repository -----------------------


def _serve(sock: socket.socket, listener: socket.socket | None = None, why_cold=None) -> dict | None:
    """Forks a child per request: a roll-train's from pytest over `sock`, or a Ray worker's from a launcher
    over `listener` (tests/warm_workers.py) unless `why_cold(request)` says why not; returns the request in
    the child, None in the zygote when `sock` closes (pytest is gone)."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, int] = {}  # pid -> the write end of its status pipe
    while True:
        readable = select.select([sock, wake_read, *([listener] if listener else [])], [], [])[0]
        if wake_read in readable:
            os.read(wake_read, 4096)
            while children:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                if pid in children:
                    try:
                        os.write(children[pid], STATUS.pack(status))
                    except BrokenPipeError:  # nobody waits for it any more (a launcher killed outright)
                        pass
                    os.close(children.pop(pid))
        for source in {sock, listener} & set(readable):  # (None is never readable)
            connection = listener.accept()[0] if source is listener else sock
            data, fds = _receive(connection)
            if not data:
                if source is sock:
                    return None
                connection.close()
                continue
            request = json.loads(data)
            if request.get("kind") == "worker" and (reason := why_cold(request)):
                pid = None
            else:
                pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for fd in (wake_read, wake_write, *children.values()):
                    os.close(fd)
                for open_socket in {sock, listener, connection} - {None}:
                    open_socket.close()
                request["fds"] = fds
                return request
            if pid is not None:
                children[pid] = fds[3]
            for fd in fds if pid is None else fds[:3] + fds[4:]:  # the status pipe's write end: for the exit status
                os.close(fd)
            connection.sendall(f"{pid if pid is not None else reason}\n".encode())
            if connection is not sock:
                connection.close()


def _receive(connection: socket.socket) -> tuple[bytes, list[int]]:
    """A request: a JSON line, with the descriptors that came with its first bytes."""
    data, fds, _, _ = socket.recv_fds(connection, 65536, 5)
    while data and not data.endswith(b"\n"):
        part = connection.recv(65536)
        data = data + part if part else b""
    return data, fds


def _become(request: dict) -> None:
    """In the child: the process `python -m roll_lite.cli ARGV` would be, started in its cwd with its env."""
    if request["new_session"]:
        os.setsid()
    os.close(request["fds"][3])  # the status pipe: the zygote's to write
    _adopt(request, None)
    sys.argv = [str(REPO / "roll_lite" / "cli.py"), *request["argv"]]


def _adopt(request: dict, first: str | None) -> None:
    """In a child: the request's stdin/stdout/stderr, cwd and environment, and the sys.path a fresh
    interpreter would have, `first` (None: the cwd, as `python -m` puts it) first."""
    for target, fd in enumerate(request["fds"][:3]):
        os.dup2(fd, target)
    for fd in set(request["fds"][:3]) - {0, 1, 2}:
        os.close(fd)
    os.chdir(request["cwd"])
    # The zygote's sys.path: what its imports put first (Ray's thirdparty_files), its start's (cwd,
    # $PYTHONPATH, stdlib, site-packages), what its imports put after. The child's: the same, with its own
    # first entry and $PYTHONPATH, after the same imports.
    start = request["start_path"]
    at = next(i for i in range(len(sys.path)) if sys.path[i : i + len(start)] == start)
    before, after = sys.path[:at], sys.path[at + len(start) :]
    stdlib_and_site = start[1 + len(_python_path(os.environ)) :]
    os.environ.clear()
    os.environ.update(request["env"])
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))  # as in the zygote: a change is not forked

    def stream(fd: int, write: bool, errors: str, line_buffering: bool) -> io.TextIOWrapper:
        binary = io.open(fd, "wb" if write else "rb", buffering=0 if unbuffered and write else -1, closefd=False)
        return io.TextIOWrapper(
            binary, encoding="utf-8", errors=errors, line_buffering=line_buffering, write_through=unbuffered and write
        )

    sys.stdin = sys.__stdin__ = stream(0, False, "strict", False)
    sys.stdout = sys.__stdout__ = stream(1, True, "strict", os.isatty(1))
    sys.stderr = sys.__stderr__ = stream(2, True, "backslashreplace", True)
    sys.path[:] = [*before, first or os.getcwd(), *_python_path(os.environ), *stdlib_and_site, *after]


def _preload(modules: tuple[str, ...]) -> str:
    if sys.path[1 : 1 + len(_python_path(os.environ))] != _python_path(os.environ):
        return f"not forking: $PYTHONPATH is not where expected on sys.path {sys.path}"
    for module in modules:
        __import__(module)
    gc.freeze()  # the forks' collections leave the imported objects alone: their pages stay shared
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:  # a thread would not be in the forks (OpenBLAS starts some unless OMP_NUM_THREADS=1)
        return f"not forking: {threads} threads after the imports"
    return "ready " + ",".join(sorted({name.split(".")[0] for name in sys.modules}))


if __name__ == "__main__":
    connection = socket.socket(fileno=int(sys.argv[1]))
    sys.path[0] = os.getcwd()  # the repository, as for `python -m roll_lite.cli` run there
    start_path, start_env = list(sys.path), dict(os.environ)
    workers_socket = None
    if os.environ.get(warm_workers.SOCKET_VARIABLE) != "0":  # 0: Ray starts the workers as it does
        workers_socket = warm_workers.fork_zygote(connection, start_path, start_env, sys.modules[__name__])
    state = _preload(PRELOAD)
    connection.sendall(f"{state}\n".encode())
    if not state.startswith("ready "):
        os._exit(0)
    if workers_socket:
        warm_workers.install(workers_socket)
    child = _serve(connection)
    if child is None:
        os._exit(0)  # nothing to flush, and no finalizers to run (triton's bindings report leaks at exit)
    _become({**child, "start_path": start_path})
    if workers_socket:
        os.environ[warm_workers.SOCKET_VARIABLE] = workers_socket  # for the launchers of its cluster
    import runpy

    del sys.modules["roll_lite.cli"]  # `python -m` runs it as __main__ only, never imported under its name
    runpy.run_module("roll_lite.cli", run_name="__main__", alter_sys=True)
