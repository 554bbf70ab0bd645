"""The sandbox's users, as root: each pool slot claims a uid of its own in SANDBOX_UIDS by holding an
exclusive flock on /tmp/roll_lite_sandbox_uids/<uid>.lock while the pool lives, so that two pools on one
machine (two runs, two test processes) never share one. That matters because the kernel counts
RLIMIT_NPROC per uid (one program's fork bomb must not starve another's), and because the rlimits
mode kills every process of its uid after each run. A lock dies with its process, so a crashed run
frees its uids. Not root: no uids (the sandbox runs as the invoking user, in a user namespace).
"""

from __future__ import annotations

import contextlib
import fcntl
import os

SANDBOX_UIDS = range(61000, 62000)
LOCK_DIR = "/tmp/roll_lite_sandbox_uids"


class SandboxUsers:
    def __init__(self, count: int):
        self.uids: list[int | None] = [None] * count
        self._locks: list[int] = []
        if os.geteuid() != 0:
            return
        os.makedirs(LOCK_DIR, mode=0o700, exist_ok=True)
        self.uids = []
        for uid in SANDBOX_UIDS:
            if len(self.uids) == count:
                return
            fd = os.open(os.path.join(LOCK_DIR, f"{uid}.lock"), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self._locks.append(fd)
            self.uids.append(uid)
        self.release()
        raise RuntimeError(
            f"no free sandbox uid: all {len(SANDBOX_UIDS)} of {SANDBOX_UIDS.start}..{SANDBOX_UIDS.stop - 1} "
            f"are held by other pools on this machine ({LOCK_DIR})"
        )

    def release(self) -> None:
        for fd in self._locks:
            os.close(fd)
        self._locks = []


@contextlib.contextmanager
def one_user():
    """A uid for a single run outside a pool (None when not root)."""
    users = SandboxUsers(1)
    try:
        yield users.uids[0]
    finally:
        users.release()
