"""What one sandboxed program may use, and the rlimits that hold it to that.

Wall-clock time and output size are enforced by the parent (process.py), which reads the program's
output and kills its process group; the disk is a size-limited tmpfs (bwrap); everything else is
an rlimit set by `prlimit` just before the program starts, so the kernel enforces it whatever the
program does.
"""

from __future__ import annotations

from dataclasses import dataclass

MB = 1 << 20


@dataclass(frozen=True)
class Limits:
    wall_s: float = 5.0  # from start to exit, the parent's clock: then the whole sandbox is killed
    cpu_s: int = 5  # CPU seconds (RLIMIT_CPU): SIGXCPU, then SIGKILL a second later
    memory_mb: int = 1024  # address space (RLIMIT_AS): an allocation past it fails
    file_mb: int = 16  # the largest file it may write (RLIMIT_FSIZE)
    disk_mb: int = 32  # its working directory and /tmp, each a tmpfs of this size (bwrap only)
    open_files: int = 64  # file descriptors (RLIMIT_NOFILE)
    processes: int = 16  # processes and threads of its user (RLIMIT_NPROC): a fork bomb stops here
    output_kb: int = 1024  # stdout + stderr it may write: past it the sandbox is killed

    def __post_init__(self):
        for name in ("wall_s", "cpu_s", "memory_mb", "file_mb", "disk_mb", "open_files", "processes", "output_kb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"sandbox limit {name} must be a positive number, got {value!r}")
        if self.open_files < 16:
            raise ValueError(
                f"sandbox limit open_files must be at least 16 (Python needs a few), got {self.open_files}"
            )

    @property
    def output_bytes(self) -> int:
        return int(self.output_kb * 1024)

    def prlimit_args(self) -> list[str]:
        """prlimit's options: soft and hard limits alike, so the program cannot raise them back, but
        CPU, whose soft limit sends SIGXCPU and hard limit SIGKILL a second later. They are set inside
        the sandbox just before the program starts, once it runs as its own user (isolation.py): the
        kernel counts RLIMIT_NPROC per user."""
        cpu, memory, file = int(self.cpu_s), int(self.memory_mb * MB), int(self.file_mb * MB)
        return [
            f"--cpu={cpu}:{cpu + 1}",
            f"--as={memory}:{memory}",
            f"--fsize={file}:{file}",
            f"--nofile={self.open_files}:{self.open_files}",
            f"--nproc={self.processes}:{self.processes}",
            "--core=0:0",
        ]
