"""Serving a web app on 127.0.0.1 from an environment process: the `app` kwarg of the `openenv` and `ors`
environments. The server is a thread of that process, so it ends with it (and the process dies with the run:
roll_lite.rewards.guarded's parent-death signal), also when the run is killed."""

from __future__ import annotations

import math
import socket
import threading
import time
from typing import Any

from roll_lite.errors import ConfigError

CONNECT_TIMEOUT_S, MESSAGE_TIMEOUT_S = 3.0, 5.0  # the served environments' defaults, also what the check adds up

_SERVED: dict[str, str] = {}  # app spec -> its url, in this process
_LOCK = threading.Lock()


def check_server_kwargs(
    kwargs: dict[str, Any], name: str, schemes: tuple[str, ...], section: str, step_timeout_s: float | None
) -> None:
    """The keys every served environment has: exactly one of `url` (a running server, its scheme one of
    `schemes`, "http" say, or its secure form) or `app` (package.module:factory, served here), and the two
    timeouts, whose sum must fit in the runner's `step_timeout_s` (else a slow server is killed as `timed_out`
    before the adapter can name it)."""
    url, app = kwargs.get("url"), kwargs.get("app")
    if (url is None) == (app is None):
        raise ConfigError(f"{section}.kwargs.url: {name} needs exactly one of url (a running server) or app")
    if url is not None and (
        not isinstance(url, str) or not url.startswith(tuple(f"{base}{s}://" for base in schemes for s in ("", "s")))
    ):
        described = " or ".join(f"{base}(s)://" for base in schemes)
        raise ConfigError(f"{section}.kwargs.url: must be an {described} address, got {url!r}")
    if app is not None and (not isinstance(app, str) or ":" not in app):
        raise ConfigError(f"{section}.kwargs.app: must be a package.module:factory, got {app!r}")
    for key in ("connect_timeout_s", "message_timeout_s"):
        value = kwargs.get(key, 1.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{section}.kwargs.{key}: must be a number > 0, got {value!r}")
    budget = kwargs.get("connect_timeout_s", CONNECT_TIMEOUT_S) + kwargs.get("message_timeout_s", MESSAGE_TIMEOUT_S)
    if isinstance(step_timeout_s, (int, float)) and budget >= step_timeout_s:
        raise ConfigError(
            f"{section}.kwargs.message_timeout_s: connect_timeout_s + message_timeout_s = {budget:g} s must be under "
            f"{section}.step_timeout_s = {step_timeout_s:g} s"
        )


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
