"""The environment process: hosts the environments one runner worker owns and calls them one at a time.

Started by process.py (with roll_lite.rewards.guarded's plumbing: length-prefixed pickles over its
stdin and original stdout; prints go to stderr). Every request but "release" gets one reply:

    ("load", spec, kwargs)                      -> ("ready", error or None, reset's field names or None)
    ("reset", env_id, seed, fields)             -> (status, (observation, info), seconds)
    ("step", env_id, action)                    -> (status, (observation, reward, terminated, truncated, info), seconds)
    ("replay", env_id, seed, fields, actions, expected) -> (status, None, seconds)
    ("release", env_id)                         -> no reply: a trajectory the caller gave up
    ("shutdown",)                               -> close() every instance, exit

status is "ok", or "raised" / "bad_return" with the error text in place of the payload (replay:
"lost"). An instance whose episode ended is kept for the next reset (building one can be costly, a
dataset to load); one that raised or returned something wrong is dropped.
"""

from __future__ import annotations

import time

from roll_lite.environments.contract import BadImage, BadReturn, checked_reset, checked_step, reset_parameters
from roll_lite.environments.registry import resolve_environment
from roll_lite.rewards.calls import describe
from roll_lite.rewards.guarded import Reader, child_pipes, send

# A user's sys.exit() or a stray KeyboardInterrupt fails that call, not the process.
_CALL_ERRORS = (Exception, SystemExit, KeyboardInterrupt)


class Host:
    def __init__(self, spec: str, kwargs: dict):
        self.environment_class = resolve_environment(spec)
        self.kwargs = kwargs
        self.idle = [self.environment_class(**kwargs)]  # built at load: a bad kwarg stops the start
        self.running: dict = {}

    def reset(self, env_id, seed, fields) -> tuple:
        self.release(env_id)
        try:
            environment = self.idle.pop() if self.idle else self.environment_class(**self.kwargs)
            payload = checked_reset(environment.reset(seed=seed, **fields))
        except BadImage as error:
            return "bad_image", str(error)
        except BadReturn as error:
            return "bad_return", str(error)
        except _CALL_ERRORS as error:
            return "raised", describe(error)
        self.running[env_id] = environment
        return "ok", payload

    def step(self, env_id, action: str) -> tuple:
        environment = self.running.pop(env_id)
        try:
            transition = checked_step(environment.step(action))
        except BadImage as error:
            return "bad_image", str(error)
        except BadReturn as error:
            return "bad_return", str(error)
        except _CALL_ERRORS as error:
            return "raised", describe(error)
        if transition.terminated or transition.truncated:
            self.idle.append(environment)
        else:
            self.running[env_id] = environment
        return "ok", (
            transition.observation,
            transition.reward,
            transition.terminated,
            transition.truncated,
            transition.info,
        )

    def replay(self, env_id, seed, fields, actions, expected) -> tuple:
        """Rebuild an environment lost with a restarted process: reset and step it as before, and check
        every result against the recorded one (observation, reward, terminated, truncated)."""
        status, payload = self.reset(env_id, seed, fields)
        if status != "ok":
            return "lost", f"replaying reset: {status}: {payload}"
        if payload[0] != expected[0]:
            self.release(env_id)
            return "lost", "replaying reset gave another observation (not deterministic given its seed?)"
        for turn, (action, recorded) in enumerate(zip(actions, expected[1:]), start=1):
            status, payload = self.step(env_id, action)
            if status != "ok":
                return "lost", f"replaying step {turn}: {status}: {payload}"
            if tuple(payload[:4]) != tuple(recorded):
                self.release(env_id)
                return "lost", (
                    f"replaying step {turn} gave another result than the first time (not deterministic "
                    "given its seed and actions?)"
                )
        return "ok", None

    def release(self, env_id) -> None:
        environment = self.running.pop(env_id, None)
        if environment is not None:
            self.idle.append(environment)

    def close(self) -> None:
        for environment in [*self.running.values(), *self.idle]:
            close = getattr(environment, "close", None)
            try:
                if close is not None:
                    close()
            except _CALL_ERRORS:
                pass


def main() -> None:
    requests, replies = child_pipes()
    host: Host | None  # from the parent's first message, "load"
    reader, host = Reader(requests), None
    while True:
        try:
            message = reader.read()
        except EOFError:
            return
        kind = message[0]
        if kind == "load":
            try:
                host = Host(*message[1:])
                send(replies, ("ready", None, reset_parameters(host.environment_class)))
            except _CALL_ERRORS as error:
                send(replies, ("ready", describe(error), None))
        elif kind == "release":
            assert host is not None  # the parent sends nothing more after a failed load
            host.release(message[1])
        elif kind == "shutdown":
            assert host is not None
            host.close()
            return
        else:
            assert host is not None
            started = time.perf_counter()
            status, payload = getattr(host, kind)(*message[1:])
            seconds = time.perf_counter() - started
            try:
                send(replies, (status, payload, seconds))
            except OSError:
                raise
            except Exception as error:  # the pickle failed, before anything was written
                host.running.pop(message[1], None)
                send(replies, ("bad_return", f"its return does not pickle: {describe(error)}", seconds))
