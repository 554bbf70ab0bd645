"""The local Ray cluster's processes go with the driver, also when it is killed (kill -9, the OOM killer).

Ray ties the GCS and the raylet to the driver (prctl PR_SET_PDEATHSIG): they die with it, and the
workers within ~2 s. The raylet's runtime-env agent (ray::RuntimeEnvAgent) notices its death at once
too, but then reports it to the GCS, which is gone, and waits out that call's 60 s timeout before it
exits (ray/_private/process_watcher.py, report_raylet_error_logs); a SIGTERM'd raylet (ray.shutdown)
spares it that. (Ray's dashboard agent did the same; a local cluster's has a stand-in, lean_cluster.py,
that ends with the raylet.) So a watcher process notes the raylet's children every few
seconds (pid and start time: a pid used again later is not theirs; their environment cannot tell,
setproctitle overwrites it) until the driver ends (end of file on a pipe that only the driver holds
open), then kills those still there.

This file is also the watcher's script: `python -I -S leftovers.py RAYLET_PID`, stdlib only.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

LOOK_EVERY_S = 5  # the agents start with the raylet; workers started later die within ~2 s anyway
_watcher: subprocess.Popen | None = None


def watch_local_cluster() -> None:
    """After ray.init started a local cluster: a watcher for its raylet (see above)."""
    global _watcher
    if not sys.platform.startswith("linux"):
        return
    raylet = next((pid for pid in _children(os.getpid()) if _read(f"/proc/{pid}/comm").strip() == "raylet"), None)
    if raylet is not None:
        _watcher = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), str(raylet)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
        )


def stop_watching() -> None:
    """After ray.shutdown: the watcher kills what is left of the cluster, and ends."""
    global _watcher
    if _watcher is not None:
        assert _watcher.stdin is not None  # started with stdin=PIPE
        _watcher.stdin.close()
        try:
            _watcher.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        _watcher = None


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:  # gone, or another user's
        return ""


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command name: [0] state, [1] parent pid, [19] start time (clock ticks)."""
    stat = _read(f"/proc/{pid}/stat")
    return stat.rsplit(")", 1)[1].split() if stat else []


def _started(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[19] if fields else None


def _children(pid: int) -> list[int]:
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    return [p for p in pids if (fields := _stat_fields(p)) and int(fields[1]) == pid]


def main(raylet: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: outlive the driver
    seen: dict[int, str | None]
    raylet_started, seen = _started(raylet), {}  # pid -> start time, of the raylet's children
    while True:
        if raylet_started is not None and _started(raylet) == raylet_started:  # still this cluster's raylet
            seen.update((pid, _started(pid)) for pid in _children(raylet))
        if select.select([sys.stdin], [], [], LOOK_EVERY_S)[0] and not os.read(sys.stdin.fileno(), 65536):
            break  # the driver ended
    for pid, started in seen.items():
        if started is not None and _started(pid) == started:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


if __name__ == "__main__":
    main(int(sys.argv[1]))
