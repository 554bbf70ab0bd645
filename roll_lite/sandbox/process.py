"""Running one program in the sandbox: its files written to a fresh directory, its stdin from a
file, its stdout and stderr read under the output cap, the wall clock watched, and the whole
sandbox killed at the end, whatever happened.

The outcome is a Run: how it ended (`exited`, `timed_out`, `output_limit`) with the exit code or
signal, its stdout (at most the cap) and its stderr's last 4 KB. A run whose sandbox failed to start
raises SandboxError: that is the sandbox's failure, never the program's. (A failure of setpriv or
prlimit inside the sandbox would be every run's, and the pool's start-up check catches it.)
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass

from roll_lite.sandbox.isolation import KILL_WAIT_S, Isolation, kill_user_processes
from roll_lite.sandbox.limits import Limits
from roll_lite.sandbox.users import one_user

STDERR_TAIL = 4096


class SandboxError(RuntimeError):
    """The sandbox itself failed (it could not start, or it broke): not the program's doing."""


@dataclass(frozen=True)
class Run:
    ending: str  # exited | timed_out | output_limit
    exit_code: int | None  # when exited: the code, or -N for signal N (e.g. -24: SIGXCPU, the CPU limit)
    stdout: bytes
    stderr: bytes  # the last STDERR_TAIL bytes
    wall_s: float

    @property
    def cpu_limited(self) -> bool:
        return self.exit_code in (-signal.SIGXCPU, -signal.SIGKILL) and self.ending == "exited"


def run_program(
    isolation: Isolation,
    limits: Limits,
    files: dict[str, str],
    argv: list[str],
    stdin: bytes = b"",
    user: int | None = None,
) -> Run:
    """`argv` (which names its files through isolation.code_path) with `files` ({name: text}) beside
    it, in a sandbox of its own; `user`: the uid it runs as, as root (a pool slot's; None: one
    claimed for this run)."""
    if user is None and isolation.as_root:
        with one_user() as claimed:
            return run_program(isolation, limits, files, argv, stdin, claimed)
    scratch = tempfile.mkdtemp(prefix="roll_sandbox_")
    try:
        code_dir, work_dir = os.path.join(scratch, "code"), os.path.join(scratch, "work")
        os.mkdir(code_dir)
        os.mkdir(work_dir)
        os.chmod(scratch, 0o755)
        for name, text in files.items():
            with open(os.path.join(code_dir, name), "w", encoding="utf-8") as handle:
                handle.write(text)
        resolved = [arg.format(code=code_dir) if "{code}" in arg else arg for arg in argv]
        with tempfile.TemporaryFile() as stdin_file:
            stdin_file.write(stdin)
            stdin_file.seek(0)
            return _run(
                lambda ready_fd: isolation.command(resolved, code_dir, work_dir, user, limits, ready_fd),
                stdin_file,
                limits,
                user,
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run(make_command, stdin_file, limits: Limits, user: int | None) -> Run:
    ready_read, ready_write = os.pipe()
    try:
        try:
            command = make_command(ready_write)
        except BaseException:
            os.close(ready_write)
            raise
        return _watch(command, stdin_file, limits, user, ready_read, ready_write)
    finally:
        os.close(ready_read)


def _watch(command, stdin_file, limits: Limits, user: int | None, ready_read: int, ready_write: int) -> Run:
    """Starts the command, reads it, kills it and every process of `user` (the program's uid, as
    root); `ready_write` is closed here, once started."""
    start = time.monotonic()
    try:
        process = subprocess.Popen(
            command.argv,
            stdin=stdin_file,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=command.cwd,
            env=command.env,
            start_new_session=True,
            pass_fds=(ready_write,),
            user=command.user,
            group=command.user,
            extra_groups=[] if command.user is not None else None,
        )
    except OSError as error:
        raise SandboxError(f"could not start {command.argv[0]}: {error}") from error
    finally:
        os.close(ready_write)
    stdout, stderr, ending = bytearray(), bytearray(), "exited"
    try:
        ending = _drain(process, stdout, stderr, start + limits.wall_s, limits.output_bytes)
    finally:
        _kill(process, user)
    wall = time.monotonic() - start
    os.set_blocking(ready_read, False)
    try:
        started = os.read(ready_read, 16) == b"started"
    except BlockingIOError:
        started = False
    if not started:
        raise SandboxError(
            f"{command.argv[0]} did not start the program: "
            f"{bytes(stderr[-500:]).decode(errors='replace').strip() or ending}"
        )
    code = process.returncode if ending == "exited" else None
    if code is not None and command.argv[0] == "bwrap" and code > 128:
        code = 128 - code  # bwrap exits 128 + N when its program died of signal N
    return Run(ending, code, bytes(stdout[: limits.output_bytes]), bytes(stderr[-STDERR_TAIL:]), wall)


def _drain(process, stdout: bytearray, stderr: bytearray, deadline: float, cap: int) -> str:
    """Reads both pipes to their end; `timed_out` past the deadline, `output_limit` past the cap."""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ, stdout)
        selector.register(process.stderr, selectors.EVENT_READ, stderr)
        open_pipes, total = 2, 0
        while open_pipes:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timed_out"
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fileobj)
                    open_pipes -= 1
                    continue
                total += len(chunk)
                if total > cap:
                    return "output_limit"
                key.data.extend(chunk)
                if key.data is stderr and len(stderr) > 2 * STDERR_TAIL:
                    del stderr[:-STDERR_TAIL]
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.001))
        except subprocess.TimeoutExpired:  # it closed its pipes and went on running
            return "timed_out"
        return "exited"


def _kill(process, user: int | None) -> None:
    """The whole sandbox: its process group (bwrap's namespace dies with it; the rlimits mode's
    programs left in the group die here), then, as root, every process of its user, waiting until
    they are gone, so that the slot goes back to the pool clean."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
    for pipe in (process.stdout, process.stderr):
        pipe.close()
    if user is not None and (alive := kill_user_processes(user)):
        raise SandboxError(f"sandbox uid {user}: processes {alive[:10]} still alive {KILL_WAIT_S:g} s after SIGKILL")
