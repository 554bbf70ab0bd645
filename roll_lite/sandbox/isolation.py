"""How a program is isolated: the command line that wraps it, per mode.

`bwrap` (the default; Debian's `bubblewrap`): the program runs in new network, PID, IPC and UTS
namespaces, so it has no network but its own loopback, sees only its own processes, and all of them
die with the sandbox. Its file system is built from nothing: /usr and the interpreter's prefix
read-only, a fresh /proc and /dev, the program's files read-only at /code, and a size-limited tmpfs
as its working directory (/work) and /tmp. Nothing of the host's /tmp, the repository, /root or /home
is there. The environment is emptied. As root it then drops to a user of its own per pool slot
(users.py; no capabilities, no_new_privs); otherwise it runs in a new user namespace as the invoking
user. `prlimit` sets the rlimits (limits.py) last, just before the program.

`rlimits` (weaker, only when the user asks for it: reward.sandbox.isolation=rlimits): the same
rlimits, timeout, output cap and emptied environment, a fresh working directory, the program killed
with the worker (`setpriv --pdeathsig`), and, as root, a user of its own per slot whose every
process is killed after each run. No namespaces: the program can reach the network, read whatever
that user may read and write to world-writable places such as /tmp.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

from roll_lite.sandbox.limits import MB, Limits

MODES = ("bwrap", "rlimits")
CODE_DIR, WORK_DIR = "/code", "/work"
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8"}


class SandboxUnavailable(RuntimeError):
    """A mechanism the chosen isolation needs is missing: raised at start-up, never silently weakened."""


@dataclass(frozen=True)
class Command:
    argv: list[str]
    env: dict[str, str]
    cwd: str  # where the wrapper starts (the program's own working directory is set inside)
    user: int | None = None  # Popen's user / group (the rlimits mode as root)


@dataclass(frozen=True)
class Isolation:
    mode: str = "bwrap"
    python: str = ""  # the interpreter that runs the programs; "": the run's own (its real path)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"isolation must be one of {', '.join(MODES)}, got {self.mode!r}")
        object.__setattr__(self, "python", os.path.realpath(self.python or sys.executable))

    @property
    def as_root(self) -> bool:
        return os.geteuid() == 0

    def require(self) -> None:
        """Raises SandboxUnavailable naming what is missing and how to get it."""
        if not os.path.isfile(self.python) or not os.access(self.python, os.X_OK):
            raise SandboxUnavailable(f"reward.sandbox.python: {self.python} is not an executable file")
        needed = ["bash", "prlimit"] + (
            ["bwrap"] + (["setpriv"] if self.as_root else []) if self.mode == "bwrap" else ["setpriv"]
        )
        if missing := [tool for tool in needed if shutil.which(tool) is None]:
            hint = (
                "bubblewrap is Debian's `bubblewrap` (apt-get install bubblewrap; scripts/setup.sh installs it "
                "when run as root); prlimit and setpriv are util-linux's"
            )
            weaker = (
                " Or accept a weaker sandbox (no namespaces: network, files and processes not isolated, "
                "docs/sandbox.md) with reward.sandbox.isolation=rlimits."
                if self.mode == "bwrap"
                else ""
            )
            raise SandboxUnavailable(
                f"the code sandbox (reward.sandbox.isolation={self.mode}) needs "
                f"{', '.join(missing)}, not found on PATH: {hint}.{weaker}"
            )

    def code_path(self, code_dir: str, name: str) -> str:
        """Where the program sees one of its files."""
        return f"{CODE_DIR}/{name}" if self.mode == "bwrap" else os.path.join(code_dir, name)

    def command(
        self, argv: list[str], code_dir: str, work_dir: str, user: int | None, limits: Limits, ready_fd: int
    ) -> Command:
        """`argv` run isolated; `code_dir` holds its files (read-only for it), `work_dir` is a fresh
        empty directory (its working directory in the rlimits mode; unused by bwrap, whose is a tmpfs);
        `user` is the uid it runs as (as root; users.py), None otherwise.
        Inside the sandbox bash (dash takes no fd over 9) writes `started` to `ready_fd` and closes it before anything of the
        program's runs: a run without that word is the sandbox's failure, whatever the program printed."""
        limited = ["prlimit", *limits.prlimit_args(), "--", *argv]
        ready = ["bash", "-c", f'printf started >&{ready_fd} && exec {ready_fd}>&- && exec "$@"', "bash"]
        if self.as_root and user is None:
            raise ValueError("as root, a sandboxed run needs a user of its own (roll_lite/sandbox/users.py)")
        if self.mode == "rlimits":
            if user is not None:
                os.chown(work_dir, user, user)
            # No namespace dies with this process here, as bwrap's does (--die-with-parent): the program
            # gets SIGKILL when the thread that started it (and waits for it) ends, and exits at once if
            # that process died before setpriv asked for the signal (bash's $PPID is no longer it).
            orphan_check = f'[ "$PPID" = {os.getpid()} ] || exit 1; '
            ready[2] = orphan_check + ready[2]
            dies_with_parent = ["setpriv", "--pdeathsig", "KILL"]
            return Command([*dies_with_parent, *ready, *limited], {**_ENV, "HOME": work_dir}, work_dir, user)
        disk = str(int(limits.disk_mb * MB))
        wrapper = [
            "bwrap",
            "--die-with-parent",
            "--new-session",
            "--unshare-net",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--hostname",
            "sandbox",
            *self._file_system(),
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            disk,
            "--perms",
            "1777",
            "--tmpfs",
            "/tmp",
            "--size",
            disk,
            "--perms",
            "1777",
            "--tmpfs",
            WORK_DIR,
            "--chdir",
            WORK_DIR,
            "--ro-bind",
            code_dir,
            CODE_DIR,
            "--clearenv",
        ]
        for key, value in {**_ENV, "HOME": WORK_DIR}.items():
            wrapper += ["--setenv", key, value]
        if self.as_root:
            drop = [
                "setpriv",
                f"--reuid={user}",
                f"--regid={user}",
                "--clear-groups",
                "--no-new-privs",
                "--inh-caps=-all",
                "--bounding-set=-all",
            ]
            return Command([*wrapper, "--", *ready, *drop, *limited], {"PATH": _ENV["PATH"]}, work_dir)
        return Command([*wrapper, "--unshare-user", "--", *ready, *limited], {"PATH": _ENV["PATH"]}, work_dir)

    def _file_system(self) -> list[str]:
        """/usr read-only (and /bin, /lib, /lib64, /sbin as the host has them), and the interpreter's
        prefix when it lives elsewhere (pyenv under /root, a conda or uv install under /home or /opt),
        with its parent directories made traversable (bwrap copies the host's modes otherwise)."""
        args = ["--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/lib", "/lib64", "/sbin"):
            if os.path.islink(top):
                args += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                args += ["--ro-bind", top, top]
        prefix = os.path.dirname(os.path.dirname(self.python))  # <prefix>/bin/python3.x
        if prefix != "/usr" and not prefix.startswith("/usr/"):
            parts = prefix.strip("/").split("/")
            for depth in range(1, len(parts)):
                args += ["--perms", "0755", "--dir", "/" + "/".join(parts[:depth])]
            args += ["--ro-bind", prefix, prefix]
        return args


KILL_WAIT_S = 10.0  # how long a sandbox user's processes may take to die after SIGKILL


def kill_user_processes(user: int, wait_s: float = KILL_WAIT_S) -> list[int]:
    """Every process of a sandbox user, SIGKILLed, and gone before this returns (as root: in the
    rlimits mode a program that left the process group would otherwise outlive its run; in both modes
    a killed fork bomb's processes take a few ms to exit and would count against the next program's
    RLIMIT_NPROC in the same slot). Returns the pids still there after `wait_s` (none, normally)."""
    deadline = time.monotonic() + wait_s
    while alive := user_processes(user):  # none: none can appear, only that user's could start one
        if time.monotonic() > deadline:
            return alive
        _signal_user_processes(user)
        time.sleep(0.005)
    return []


def user_processes(user: int) -> list[int]:
    """pids whose owner is `user`."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == user:
                    pids.append(int(entry))
            except FileNotFoundError:
                pass
    return pids


def _signal_user_processes(user: int) -> None:
    subprocess.run(
        ["kill", "-s", "KILL", "--", "-1"],
        user=user,
        group=user,
        extra_groups=[],
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=10,
    )
