"""Environment servers for the adapter tests (test_openenv.py, test_ors.py): a FastAPI app served by uvicorn in a
process forked from the test's (before any client starts a thread), on a port bound first, so it answers once
start_server returns; stop_server kills it by its pid."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import time
from typing import Any, Callable


def _serve(make_app: Callable[[], Any], sock: socket.socket) -> None:
    import uvicorn

    uvicorn.Server(uvicorn.Config(make_app(), log_level="critical", lifespan="off")).run(sockets=[sock])


def start_server(make_app: Callable[[], Any]) -> tuple[int, str]:
    """A forked server's (pid, url) for the app make_app() returns, answering once this returns."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    process = multiprocessing.get_context("fork").Process(target=_serve, args=(make_app, sock), daemon=True)
    process.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(sock.getsockname(), timeout=1).close()
            return process.pid, f"http://127.0.0.1:{sock.getsockname()[1]}"
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("the server did not start")


def stop_server(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
