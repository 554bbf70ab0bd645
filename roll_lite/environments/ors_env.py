"""`ors`: an environment of the Open Reward Standard, played with the `openreward` SDK's own client (0.1.167:
AsyncEnvironmentsAPI, AsyncSession) against an ORS server on 127.0.0.1 or at a URL. No API key and nothing of
the hosted platform: the client is pointed at that server only, and the SDK's PyPI version check is off.

    environment: {name: ors, kwargs: {env_id: guessthenumberenv, app: "roll_lite.environments.ors_guess:make_server"}}
    environment: {name: ors, kwargs: {env_id: guessthenumberenv, url: "http://127.0.0.1:8080"}}

`env_id` is the environment's ORS name on the server (its class name, lower case), as `gem`'s env_id is GEM's.
`app` names a `package.module:factory` returning an `openreward.environments.Server` (or its FastAPI app): each
environment process serves it on 127.0.0.1, on a free port, in a thread that ends with the process (loopback.py).

One ORS session per trajectory. reset opens it on the row's task: the row's fields are the task spec, or,
with `split` set, the row's `index` names a task of that split. The observation is the session's prompt (its
text blocks). Each model turn is sent to the tool `tool` as its one input field (default: the environment's
@terminal tool, which a plain answer goes to); the tool's text blocks are the next observation, its reward the
step's reward, its `finished` ends the episode (terminated; truncated when its metadata says "truncated": true,
as ORS has no word for a cut), its other metadata is the step's info.

An image block (its base64 data) becomes an image part of the observation, for a vision-language policy
(docs/vision.md); one that is not base64 or not an image ends that trajectory as the fault "bad_image". A server
that is down, closes the session, passes `message_timeout_s`, or answers with an error or another block raises,
which ends that trajectory as the fault "raised" (env/faults/raised), never the run.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import threading
from typing import Any

from roll_lite.environments.loopback import CONNECT_TIMEOUT_S, MESSAGE_TIMEOUT_S, check_server_kwargs, serve_app
from roll_lite.environments.registry import register_environment
from roll_lite.errors import ConfigError

KWARGS = ("env_id", "url", "app", "split", "tool", "connect_timeout_s", "message_timeout_s")
_LOOP: asyncio.AbstractEventLoop | None = None  # the SDK's async client runs here, one loop per process
_LOCK = threading.Lock()


class OrsServerError(RuntimeError):
    """The server failed a reset or step: down, closed, too slow, an error answer or a non-text block."""


def check_ors_kwargs(kwargs, section: str = "environment", step_timeout_s: float | None = None) -> None:
    """ConfigError naming the first bad key of environment.kwargs for `name: ors`."""
    unknown = sorted(set(kwargs) - set(KWARGS))
    if unknown:
        raise ConfigError(f"{section}.kwargs.{unknown[0]}: not a key of ors; the keys are {', '.join(KWARGS)}")
    for key in ("env_id", "split", "tool"):
        value = kwargs.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigError(f"{section}.kwargs.{key}: must be a non-empty str, got {value!r}")
    if kwargs.get("env_id") is None:
        raise ConfigError(f"{section}.kwargs.env_id: ors needs the environment's name on the server")
    check_server_kwargs(kwargs, "ors", ("http",), section, step_timeout_s)


@register_environment("ors")
class OrsEnvironment:
    def __init__(
        self,
        env_id: str,
        url: str | None = None,
        app: str | None = None,
        split: str | None = None,
        tool: str | None = None,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        message_timeout_s: float = MESSAGE_TIMEOUT_S,
    ):
        check_ors_kwargs({k: v for k, v in locals().items() if k in KWARGS and v is not None})
        os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")  # else every client asks pypi.org
        os.environ.setdefault("OPENREWARD_LOG_LEVEL", "WARNING")  # else a line per request
        try:
            from openreward.api.environments.client import AsyncEnvironmentsAPI
        except ModuleNotFoundError as error:
            raise ModuleNotFoundError(
                f"the 'ors' environment needs the openreward SDK: pip install openreward==0.1.167 ({error})",
                name=error.name,
            ) from None
        self.url = url if url is not None else serve_app(str(app), connect_timeout_s, "ors")
        self.name, self.split, self.tool = env_id, split, tool
        self.connect_timeout_s, self.message_timeout_s = connect_timeout_s, message_timeout_s
        self.api = self._run(_make(AsyncEnvironmentsAPI, self.url), connect_timeout_s, "connect")
        self.environment = self._run(_get(self.api, env_id, self.url), connect_timeout_s, "connect")
        self.session: Any = None  # the SDK's AsyncSession of the running episode
        self.tool_field: str | None = None

    def reset(self, seed: int | None = None, **row_fields):
        self._end_session()  # a fresh session per episode, also after a failed one
        fields = {key: getattr(value, "item", lambda v=value: v)() for key, value in row_fields.items()}
        if self.split is not None:
            if not isinstance(fields.get("index"), int):
                raise ValueError(f"with kwargs.split, an ors row names its task by an int 'index'; got {fields}")
            session = self.environment.session(split=self.split, index=fields["index"])
        else:
            from openreward.api.environments.types import Task

            task = Task(server_name=self.name, environment_name=self.name, task_spec=fields, namespace=None)
            session = self.environment.session(task=task)
        self.session = self._call("reset", session.__aenter__(), self.connect_timeout_s + self.message_timeout_s)
        return observation_of(self._call("reset", self.session.get_prompt()), self.url), {}

    def step(self, action: str):
        if self.session is None:
            raise RuntimeError("step() before reset()")
        if self.tool is None:
            output = self._call("step", self.session.call_terminal_tool(action))
        else:
            if self.tool_field is None:
                self.tool_field = self._tool_field()
            output = self._call("step", self.session.call_tool(self.tool, {self.tool_field: action}))
        info = dict(output.metadata) if isinstance(output.metadata, dict) else {}
        done, cut = bool(output.finished), info.pop("truncated", False) is True  # ORS has no cut: a convention
        observation = observation_of(output.blocks, self.url)
        return observation, float(output.reward or 0.0), done and not cut, done and cut, info

    def close(self) -> None:
        self._end_session()
        _wait_quietly(self.api.aclose())

    def _end_session(self) -> None:
        """Ends the session on the server (its /delete), waiting a second at most (a dead server)."""
        if self.session is not None:
            session, self.session = self.session, None
            _wait_quietly(session.__aexit__(None, None, None))

    def _tool_field(self) -> str:
        specs = self._call("step", self.session.list_tools())
        for spec in specs:
            if spec.name == self.tool:
                fields = list((spec.input_schema or {}).get("properties", {}))
                if len(fields) == 1:
                    return fields[0]
                raise OrsServerError(f"ors tool '{self.tool}' takes {fields}, not one text field (kwargs.tool)")
        raise OrsServerError(f"ors server {self.url}: no tool '{self.tool}' (kwargs.tool); its tools: {specs}")

    def _call(self, method: str, coroutine, timeout_s: float | None = None):
        try:
            return self._run(coroutine, timeout_s or self.message_timeout_s, method)
        except OrsServerError:
            self._end_session()
            raise

    def _run(self, coroutine, timeout_s: float, method: str):
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coroutine, timeout_s), _loop())
        try:
            return future.result()
        except Exception as error:  # noqa: BLE001  (aiohttp, asyncio and openreward errors alike)
            kind = "timed out" if isinstance(error, TimeoutError) else type(error).__name__
            raise OrsServerError(f"ors server {self.url}: {method} failed ({kind}: {error})") from None


async def _make(api_class, url: str):
    return api_class(base_url=url, api_key="")  # its aiohttp session needs the running loop


async def _get(api, name: str, url: str):
    return api.get(name, variant=name, base_url=url)


def _wait_quietly(coroutine, timeout_s: float = 1.0) -> None:
    try:
        asyncio.run_coroutine_threadsafe(coroutine, _loop()).result(timeout_s)
    except Exception:  # noqa: BLE001  (a dead server: what it held is gone with it)
        pass


def observation_of(blocks, url: str) -> str | list[dict]:
    """The observation of ORS blocks: their texts joined by newlines; with an image block, the blocks as content
    parts in order, each image its base64 data decoded (contract.py checks the image: a bad one is "bad_image")."""
    from roll_lite.environments.contract import BadImage

    parts: list[dict] = []
    for block in blocks:
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append({"type": "text", "text": block.text})
        elif kind == "image":
            try:
                parts.append({"type": "image", "image": base64.b64decode(block.data, validate=True)})
            except (binascii.Error, ValueError, TypeError) as error:
                raise BadImage(f"ors server {url}: an image block whose data is not base64 ({error})") from None
        else:
            raise OrsServerError(f"ors server {url}: a {kind or type(block).__name__} block; ors reads text and images")
    if all(part["type"] == "text" for part in parts):
        return "\n".join(part["text"] for part in parts)
    return parts


def _loop() -> asyncio.AbstractEventLoop:
    global _LOOP
    with _LOCK:
        if _LOOP is None:
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, daemon=True, name="ors-loop").start()
        return _LOOP
