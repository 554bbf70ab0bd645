"""`openenv`: an environment served by OpenEnv (openenv-core 0.3.0, installed by scripts/setup.sh's envs set-up
without its web UI's gradio: pyproject.toml says why), played over its WebSocket session protocol with openenv's GenericEnvClient (one server-side session per trajectory).

    environment: {name: openenv, kwargs: {url: "http://127.0.0.1:8000"}}          # a running server
    environment: {name: openenv, kwargs: {app: "roll_lite.environments.openenv_guess:make_app"}}

`app` names a `package.module:factory` returning the server's FastAPI app (openenv's create_app), or the
app itself: each environment process serves it on 127.0.0.1, on a free port, in a thread that ends with
the process. The action goes to the server as {action_key: text}; the observation's `observation_key`
field is the text the model sees, its `truncated` (when present) tells a cut from an end, and its other
fields are the step's info. With `image_key`, that field (a base64 str or a list of them) holds images the model
sees before the text, for a vision-language policy (docs/vision.md); one that is not base64 or not an image ends
that trajectory as the fault "bad_image". reset sends the seed and the row's fields as reset's keyword arguments.

A server that is down, closes the connection, passes `message_timeout_s` or answers without the text
raises, which ends that trajectory as the fault "raised" (env/faults/raised), never the run; the
runner's step_timeout_s is the backstop. After a failure the next reset opens a fresh session.
"""

from __future__ import annotations

import base64
import binascii
import threading

from roll_lite.environments.loopback import CONNECT_TIMEOUT_S, MESSAGE_TIMEOUT_S, check_server_kwargs, serve_app
from roll_lite.environments.registry import register_environment
from roll_lite.errors import ConfigError

KWARGS = ("url", "app", "connect_timeout_s", "message_timeout_s", "action_key", "observation_key", "image_key")


class OpenEnvServerError(RuntimeError):
    """The server failed a reset or step: down, closed, too slow, or an answer without the text."""


def check_openenv_kwargs(kwargs, section: str = "environment", step_timeout_s: float | None = None) -> None:
    """ConfigError naming the first bad key of environment.kwargs for `name: openenv`; a reset opens a session
    and waits for its answer, so both timeouts must fit in the runner's `step_timeout_s` (else a slow server
    is killed as `timed_out` before the adapter can name it)."""
    unknown = sorted(set(kwargs) - set(KWARGS))
    if unknown:
        raise ConfigError(f"{section}.kwargs.{unknown[0]}: not a key of openenv; the keys are {', '.join(KWARGS)}")
    check_server_kwargs(kwargs, "openenv", ("http", "ws"), section, step_timeout_s)
    for key in ("action_key", "observation_key", "image_key"):
        if key == "image_key" and kwargs.get(key) is None:  # no images
            continue
        if not isinstance(kwargs.get(key, "text"), str) or not kwargs.get(key, "text"):
            raise ConfigError(f"{section}.kwargs.{key}: must be a non-empty str, got {kwargs.get(key)!r}")


@register_environment("openenv")
class OpenEnvEnvironment:
    def __init__(
        self,
        url: str | None = None,
        app: str | None = None,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        message_timeout_s: float = MESSAGE_TIMEOUT_S,
        action_key: str = "text",
        observation_key: str = "text",
        image_key: str | None = None,
    ):
        check_openenv_kwargs({k: v for k, v in locals().items() if k in KWARGS and v is not None})
        try:
            from openenv.core import GenericEnvClient
        except ModuleNotFoundError as error:
            raise ModuleNotFoundError(
                f"the 'openenv' environment needs openenv-core: pip install openenv-core==0.3.0 ({error})",
                name=error.name,
            ) from None
        self.url = url if url is not None else serve_app(str(app), connect_timeout_s, "openenv")
        self.client_class = GenericEnvClient
        self.timeouts = {"connect_timeout_s": connect_timeout_s, "message_timeout_s": message_timeout_s}
        self.action_key, self.observation_key, self.image_key = action_key, observation_key, image_key
        self.client = None

    def reset(self, seed: int | None = None, **row_fields):
        self.close()  # a fresh session per episode, also after a failed one
        self.client = self.client_class(base_url=self.url, **self.timeouts).sync()
        fields = {key: getattr(value, "item", lambda v=value: v)() for key, value in row_fields.items()}
        result = self._call("reset", seed=seed, **fields)
        text, _, info = self._read(result)
        return text, info

    def step(self, action: str):
        result = self._call("step", {self.action_key: action})
        text, truncated, info = self._read(result)
        done = bool(result.done)
        return text, float(result.reward or 0.0), done and not truncated, done and truncated, info

    def close(self, failed: bool = False) -> None:
        """`failed`: after a failed call the client closes in a thread of its own: openenv's close waits for
        the WebSocket closing handshake (websockets' 10 s, not settable), which a frozen server never answers."""
        if self.client is not None:
            client, self.client = self.client, None
            if failed:
                threading.Thread(target=_close_quietly, args=(client,), daemon=True, name="openenv-close").start()
            else:
                _close_quietly(client)

    def _call(self, method: str, *args, **kwargs):
        if self.client is None:
            raise RuntimeError("step() before reset()")
        try:
            return getattr(self.client, method)(*args, **kwargs)
        except Exception as error:  # noqa: BLE001  (websockets, asyncio and openenv errors alike)
            self.close(failed=True)
            kind = "timed out" if isinstance(error, TimeoutError) else type(error).__name__
            raise OpenEnvServerError(f"openenv server {self.url}: {method} failed ({kind}: {error})") from None

    def _read(self, result) -> tuple[str | list[dict], bool, dict]:
        observation = result.observation
        if not isinstance(observation, dict) or not isinstance(observation.get(self.observation_key), str):
            self.close()
            raise OpenEnvServerError(
                f"openenv server {self.url}: the observation has no str '{self.observation_key}' "
                f"(observation_key): {str(observation)[:120]}"
            )
        shown = (self.observation_key, "truncated", self.image_key)
        info = {k: v for k, v in observation.items() if k not in shown}
        text, images = observation[self.observation_key], observation.get(self.image_key) if self.image_key else None
        return with_images(text, images, self.url), bool(observation.get("truncated", False)), info


def with_images(text: str, images, url: str) -> str | list[dict]:
    """The observation: its text, after the images of the `image_key` field (a base64 str or a list of them;
    null or absent: none) as image parts (contract.py checks each: a bad one is the fault "bad_image")."""
    from roll_lite.environments.contract import BadImage

    if images is None or images == []:
        return text
    parts = []
    for j, data in enumerate(images if isinstance(images, list) else [images]):
        try:
            parts.append({"type": "image", "image": base64.b64decode(data, validate=True)})
        except (binascii.Error, ValueError, TypeError) as error:
            raise BadImage(f"openenv server {url}: image {j} of the observation is not base64 ({error})") from None
    return [*parts, {"type": "text", "text": text}]


def _close_quietly(client) -> None:
    try:
        client.close()
    except Exception:  # noqa: BLE001  (a dead server's connection may not close cleanly)
        pass
