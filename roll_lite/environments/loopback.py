"""Serving a web app on 127.0.0.1 from an environment process: the `app` kwarg of the `openenv` and `ors`
environments. The server is a thread of that process, so it ends with it (and the process dies with the run:
roll_lite.rewards.guarded's parent-death signal), also when the run is killed."""

from __future__ import annotations

import socket
import threading
import time

_SERVED: dict[str, str] = {}  # app spec -> its url, in this process
_LOCK = threading.Lock()


class ServerStartError(RuntimeError):
    """The app did not answer within the start timeout."""


def serve_app(spec: str, timeout_s: float, what: str = "app") -> str:
    """The url of `spec`'s ASGI app served in this process on 127.0.0.1, on a free port (started on first
    use). `spec` is a package.module:name naming the app, an object with the app as `.app`, or a factory of
    either."""
    with _LOCK:
        if spec not in _SERVED:
            import uvicorn

            from roll_lite.runtime.importing import load_object

            app = load_object(spec)
            if not hasattr(app, "router") and not hasattr(app, "app"):
                app = app()  # a factory
            app = app if hasattr(app, "router") else app.app
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            # critical: openenv 0.3.0 logs a traceback for every session its client closes first
            server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="off"))
            threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name=what).start()
            deadline = time.monotonic() + timeout_s
            while not server.started:
                if time.monotonic() > deadline:
                    raise ServerStartError(f"{what} app {spec} did not start within {timeout_s} s")
                time.sleep(0.01)
            _SERVED[spec] = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return _SERVED[spec]
