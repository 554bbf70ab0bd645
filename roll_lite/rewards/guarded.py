"""The guarded reward process: a child Python process that calls reward functions one by one, so a
call that hangs can be abandoned (the process is killed and started again) and one that crashes the
interpreter costs only that call.

Parent and child exchange pickled messages, each prefixed by its length, over the child's stdin and
its original stdout; the child points its fd 1 at stderr, so a reward function's prints reach the
log and never the protocol. The child dies with its parent: on Linux the kernel SIGKILLs it
(prctl PR_SET_PDEATHSIG), even while a user's function holds the GIL in C code, where a watchdog
thread could never run; elsewhere a watchdog thread makes it exit. `send`, `Reader`, `start_child`
and `child_pipes` are the plumbing of any such child: roll_lite/environments/ runs its environments
and judge_code.py a judge's parser and template in children started the same way.

    parent -> child  ("load", [spec, ...])              child -> parent  ("ready", {spec: error})
    parent -> child  ("score", spec, [(response, ground_truth, extra), ...])
                                                        child -> parent  (score, reason) per item, in order
"""

from __future__ import annotations

import json
import os
import pickle
import queue
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

_HEADER = struct.Struct("<Q")
# -I: no current directory, no PYTHONPATH, no user site; the child gets the parent's sys.path
# instead, so it imports the same roll_lite tree and the user's modules from the same places.
# sys.argv[2]: the parent's pid (child_pipes).
_BOOT = "import sys, json; sys.path[:] = json.loads(sys.argv[1]); from {module} import main; main()"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
STARTUP_TIMEOUT_S = 300.0  # importing the user's module and math-verify (sympy) on a busy machine


def send(fd: int, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


class Reader:
    """Reads whole messages from a pipe, waiting at most until a deadline (time.monotonic())."""

    def __init__(self, fd: int):
        self.fd, self.buffer = fd, bytearray()

    def read(self, deadline: float | None = None):
        while True:
            if len(self.buffer) >= _HEADER.size:
                (size,) = _HEADER.unpack_from(self.buffer)
                if len(self.buffer) >= _HEADER.size + size:
                    data = bytes(self.buffer[_HEADER.size : _HEADER.size + size])
                    del self.buffer[: _HEADER.size + size]
                    return pickle.loads(data)
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not select.select([self.fd], [], [], remaining)[0]:
                    raise TimeoutError
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                raise EOFError
            self.buffer += chunk


def start_child(module: str) -> subprocess.Popen:
    """A child Python process that runs `module`'s main() with this process's sys.path; its stdin and
    stdout are the message pipes (see child_pipes). Started by the spawner thread (_Spawner)."""
    argv = [sys.executable, "-I", "-c", _BOOT.format(module=module), json.dumps(sys.path), str(os.getpid())]
    return _spawner.start(argv)


def stop_child(process: subprocess.Popen) -> None:
    """Kill a child of start_child if it still runs, reap it and close its message pipes."""
    if process.poll() is None:
        process.kill()
    process.wait()
    for pipe in (process.stdin, process.stdout):
        assert pipe is not None  # start_child's pipes
        pipe.close()


class _Spawner:
    """Starts the children from one thread that lives as long as this process. Linux sends a child its
    parent-death signal when the thread that started it ends, not when the process does, and the reward
    worker starts (and restarts) children from the threads of a pool that ends with each batch."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.lock = threading.Lock()

    def start(self, argv: list[str]) -> subprocess.Popen:
        started: Future = Future()
        with self.lock:  # a forked copy of this process has the object, not the thread: start it again
            if self.thread is None or not self.thread.is_alive():
                self.requests = queue.SimpleQueue()
                self.thread = threading.Thread(
                    target=self._serve, args=(self.requests,), daemon=True, name="guarded-child-spawner"
                )
                self.thread.start()
            self.requests.put((argv, started))
        return started.result()

    @staticmethod
    def _serve(requests: queue.SimpleQueue) -> None:
        while True:
            argv, started = requests.get()
            try:
                process = subprocess.Popen(
                    argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, close_fds=True
                )
            except BaseException as error:  # OSError: no such interpreter, too many processes
                started.set_exception(error)
            else:
                started.set_result(process)


_spawner = _Spawner()


def child_pipes() -> tuple[int, int]:
    """In the child, first thing: (requests, replies) file descriptors. Its fd 0 becomes /dev/null and
    fd 1 stderr, so user code can neither read the protocol nor print into it; the child dies with its
    parent (_die_with_parent)."""
    _die_with_parent(int(sys.argv[2]))
    requests, replies = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)  # prints go to stderr
    return requests, replies


# -- the child ----------------------------------------------------------------------------------


def main() -> None:
    requests, replies = child_pipes()
    from roll_lite.rewards.calls import call, describe
    from roll_lite.rewards.registry import resolve_reward

    reader, functions = Reader(requests), {}
    while True:
        try:
            message = reader.read()
        except EOFError:
            return
        if message[0] == "load":
            errors = {}
            for spec in message[1]:
                try:
                    functions[spec] = resolve_reward(spec)
                    warm_up = getattr(functions[spec], "warm_up", None)
                    if warm_up is not None:
                        warm_up()
                except Exception as error:
                    errors[spec] = describe(error)
            send(replies, ("ready", errors))
        elif message[0] == "score":
            _, spec, items = message
            for response, ground_truth, extra in items:
                send(replies, call(functions[spec], response, ground_truth, extra))


def _die_with_parent(parent: int) -> None:
    """On Linux, SIGKILL from the kernel when the parent's spawner thread ends (with the parent): a
    user's function stuck in C code holding the GIL cannot keep it alive. A parent that died before
    the signal was asked for has already left this process to another: it exits now. Elsewhere, a
    watchdog thread that exits once the parent is gone (unless user code holds the GIL)."""
    if _set_parent_death_signal(signal.SIGKILL):
        if os.getppid() != parent:
            os._exit(1)
        return

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def _set_parent_death_signal(signum: int) -> bool:
    """prctl(PR_SET_PDEATHSIG, signum) through libc; False where there is none (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    # prctl is variadic and reads unsigned longs: pass them as such, not as C ints
    return (
        prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signum), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) == 0
    )


# -- the parent ---------------------------------------------------------------------------------


class GuardedProcess:
    """The parent's handle on the child; `score` returns (score, reason, timed_out) per item."""

    process: subprocess.Popen | None  # the child (start_child: its stdin and stdout are pipes); None after close()

    def __init__(self, specs: list[str]):
        self.specs, self.process, self.starts = list(specs), None, 0
        self._start()

    def _start(self) -> None:
        self.process = start_child("roll_lite.rewards.guarded")
        assert self.process.stdout is not None and self.process.stdin is not None  # start_child's pipes
        self.reader = Reader(self.process.stdout.fileno())
        self.starts += 1
        try:
            send(self.process.stdin.fileno(), ("load", self.specs))
            _, errors = self.reader.read(time.monotonic() + STARTUP_TIMEOUT_S)
        except (TimeoutError, EOFError, OSError):
            self.close()
            raise RuntimeError(
                f"the guarded reward process did not start within {STARTUP_TIMEOUT_S:g} s "
                f"(functions: {', '.join(self.specs)}); see the log above"
            ) from None
        if errors:
            self.close()
            spec, error = next(iter(errors.items()))
            raise RuntimeError(f"reward.functions.{spec}: cannot load it in the reward process: {error}")

    def score(self, spec: str, items: list[tuple], timeout_s: float) -> list[tuple[float, str | None, bool]]:
        results, pending = [], list(items)
        while pending:
            assert self.process is not None and self.process.stdin is not None  # _start() made it, with its pipes
            try:
                send(self.process.stdin.fileno(), ("score", spec, pending))
            except OSError:  # it died between batches
                self.restart()
                send(self.process.stdin.fileno(), ("score", spec, pending))
            done = 0
            try:
                for _ in pending:
                    score, reason = self.reader.read(time.monotonic() + timeout_s)
                    results.append((score, reason, False))
                    done += 1
            except TimeoutError:
                results.append((0.0, f"no result within reward.timeout_s={timeout_s:g} s", True))
            except EOFError:
                code = self.process.wait()
                results.append((0.0, f"the reward process died with exit code {code}", False))
            else:
                return results
            self.restart()  # abandon the call in flight, go on with the next item
            pending = pending[done + 1 :]
        return results

    def restart(self) -> None:
        self.close()
        self._start()

    def close(self) -> None:
        if self.process is not None:
            stop_child(self.process)
