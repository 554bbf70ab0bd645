"""The CPU seconds of a command and every process it starts: a cpuacct cgroup of its own (cgroup v1, root).
Where none can be made, `seconds()` is None and callers report wall time only.

    with CpuCgroup("speed_probe") as group:
        subprocess.run(command, preexec_fn=group.join)
        cpu = group.seconds()
"""

from __future__ import annotations

import os
import time
from pathlib import Path

CPUACCT = Path("/sys/fs/cgroup/cpuacct")


class CpuCgroup:
    def __init__(self, name: str):
        self.path: Path | None = CPUACCT / f"{name}_{os.getpid()}"

    def __enter__(self) -> CpuCgroup:
        try:
            self.path.mkdir()  # type: ignore[union-attr]
        except OSError:
            self.path = None
        return self

    def join(self) -> None:
        """preexec_fn: in the child, before exec, so it and everything it starts count."""
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def seconds(self) -> float | None:
        if self.path is None:
            return None
        time.sleep(0.5)  # the command's Ray processes are gone by now; their CPU stays counted in the group
        return int((self.path / "cpuacct.usage").read_text()) / 1e9

    def __exit__(self, *exc) -> None:
        if self.path is not None:
            try:
                self.path.rmdir()
            except OSError:
                pass
