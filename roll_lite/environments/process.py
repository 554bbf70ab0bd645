"""The runner's handle on one environment process (child.py): start it, call it with a deadline, and
kill and start it again when a call hangs or the process dies."""

from __future__ import annotations

import signal
import subprocess
import time

from roll_lite.rewards.guarded import STARTUP_TIMEOUT_S, Reader, send, start_child, stop_child


class CallTimedOut(Exception):
    pass


class ProcessDied(Exception):
    """The process ended during the call; the message says how."""


class EnvironmentProcess:
    def __init__(self, spec: str, kwargs: dict):
        self.spec, self.kwargs = spec, kwargs
        self.process: subprocess.Popen | None = None
        self.generation = 0  # how many times it was started: the environments it hosts die with each restart
        self.reset_fields: frozenset[str] | None = None

    def launch(self) -> None:
        """Start the process and send it the environment to load; `wait_ready` collects the answer, so
        several processes can start at once."""
        self.process = start_child("roll_lite.environments.child")
        assert self.process.stdout is not None and self.process.stdin is not None  # start_child's pipes
        self.reader = Reader(self.process.stdout.fileno())
        self.generation += 1
        send(self.process.stdin.fileno(), ("load", self.spec, self.kwargs))

    def wait_ready(self) -> None:
        try:
            _, error, self.reset_fields = self.reader.read(time.monotonic() + STARTUP_TIMEOUT_S)
        except (TimeoutError, EOFError, OSError):
            self.close()
            raise RuntimeError(
                f"the environment process for '{self.spec}' did not start within "
                f"{STARTUP_TIMEOUT_S:g} s; see the log above"
            ) from None
        if error is not None:
            self.close()
            raise RuntimeError(
                f"environment '{self.spec}' (kwargs {self.kwargs}): cannot build it in the environment process: {error}"
            )

    def call(self, message: tuple, timeout_s: float) -> tuple:
        """The child's reply; CallTimedOut or ProcessDied, after which the caller restarts it."""
        assert self.process is not None and self.process.stdin is not None  # launch() made it
        try:
            send(self.process.stdin.fileno(), message)
        except OSError:
            raise ProcessDied(self._death()) from None
        try:
            return self.reader.read(time.monotonic() + timeout_s)
        except TimeoutError:
            raise CallTimedOut from None
        except (EOFError, OSError):
            raise ProcessDied(self._death()) from None

    def post(self, message: tuple) -> None:
        """A message without a reply (release); a dead process is found by the next call."""
        assert self.process is not None and self.process.stdin is not None  # launch() made it
        try:
            send(self.process.stdin.fileno(), message)
        except OSError:
            pass

    def is_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def restart(self) -> None:
        self.close()
        self.launch()
        self.wait_ready()

    def shutdown(self, grace_s: float = 5.0) -> None:
        """Let the environments close() themselves, then make sure the process is gone."""
        if self.is_alive():
            self.post(("shutdown",))
            assert self.process is not None  # is_alive()
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        self.close()

    def close(self) -> None:
        if self.process is not None:
            stop_child(self.process)
            self.process = None

    def _death(self) -> str:
        assert self.process is not None  # call() found it dead: still there until close()
        try:
            code = self.process.wait(5.0)
        except subprocess.TimeoutExpired:  # it closed its end of the pipe but lives on
            self.process.kill()
            return "the environment process closed its reply pipe"
        if code < 0:
            try:
                return f"the environment process was killed by {signal.Signals(-code).name}"
            except ValueError:
                pass
        return f"the environment process died with exit code {code}"
