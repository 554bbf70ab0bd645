"""A bounded pool of sandboxes: at most `workers` programs at once, each in a slot of its own (as
root, a uid of its own that no other pool on the machine holds: users.py).

At start-up the pool proves the sandbox works instead of assuming it: a program must print 42, and
under bwrap a connection to a port this process is listening on must fail. A pool that cannot pass
that raises SandboxUnavailable before the run starts.
"""

from __future__ import annotations

import os
import queue
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from roll_lite.sandbox.isolation import Isolation, SandboxUnavailable
from roll_lite.sandbox.limits import Limits
from roll_lite.sandbox.process import Run, SandboxError, run_program
from roll_lite.sandbox.users import SandboxUsers

T = TypeVar("T")
_REACH = "import socket, sys\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('reached')\nexcept OSError:\n    print('isolated')\n"


class SandboxPool:
    def __init__(self, isolation: Isolation, limits: Limits, workers: int | None = None):
        self.isolation, self.limits = isolation, limits
        self.workers = workers or os.cpu_count() or 1
        isolation.require()
        self._users = SandboxUsers(self.workers)
        self._slots: queue.Queue[int | None] = queue.Queue()
        for user in self._users.uids:
            self._slots.put(user)
        self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="sandbox")
        try:
            self._check()
        except BaseException:
            self.close()
            raise

    def run(self, files: dict[str, str], argv: list[str], stdin: bytes = b"") -> Run:
        """One program in a free slot (blocks until one is free)."""
        user = self._slots.get()
        try:
            return run_program(self.isolation, self.limits, files, argv, stdin, user)
        finally:
            self._slots.put(user)

    def map(self, job: Callable[[T], object], items: list[T]) -> list:
        """job(item) for every item, `workers` at a time, in order; a job runs its programs through
        self.run."""
        return list(self._executor.map(job, items))

    def python(self, name: str) -> list[str]:
        """argv running the file `name` of the program's files with the sandbox's interpreter: isolated
        from the environment (-I) and with the standard library only (-S: no site-packages, whose
        import cost 25 ms of every run's 43 under bwrap here: benchmarks/sandbox.py)."""
        return [self.isolation.python, "-I", "-S", self.isolation.code_path("{code}", name)]

    def _check(self) -> None:
        try:
            hello = self.run({"main.py": "print(6 * 7)"}, self.python("main.py"))
        except SandboxError as error:
            raise SandboxUnavailable(f"the code sandbox ({self.isolation.mode}) does not start: {error}") from None
        if hello.ending != "exited" or hello.stdout.strip() != b"42":
            raise SandboxUnavailable(
                f"the code sandbox ({self.isolation.mode}) did not run `print(6 * 7)`: it "
                f"{hello.ending} with code {hello.exit_code}, stdout {hello.stdout[:200]!r}, "
                f"stderr {hello.stderr[-500:]!r}"
            )
        if self.isolation.mode != "bwrap":
            return
        with socket.create_server(("127.0.0.1", 0)) as server:
            port = server.getsockname()[1]
            reach = self.run({"main.py": _REACH.format(port=port)}, self.python("main.py"))
        if reach.stdout.strip() != b"isolated":
            raise SandboxUnavailable(
                f"the code sandbox (bwrap) is not isolated from the network: a program reached "
                f"port {port} on this host's loopback ({reach.stdout[:200]!r})"
            )

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._users.release()
