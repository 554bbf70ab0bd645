"""Ctrl-C (SIGINT) and SIGTERM on the driver: stop the run cleanly.

The handlers raise KeyboardInterrupt in the main thread (no `except Exception` on the way swallows
it), and remember which signal it was: Ray turns an interrupt inside ray.get / ray.wait into a new,
plain KeyboardInterrupt, so the exception itself cannot carry it. The current step is abandoned,
`run()`'s `finally` stops the workers and Ray, and roll-train exits with 128 + the signal number
(130, 143).

Install them after `ray.init()`: Ray's core worker installs its own SIGTERM handler in the driver,
which prints a stack dump and aborts (exit 134).
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from types import FrameType

logger = logging.getLogger("roll_lite")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received: list[int] = []
# the handlers ours replaced, put back by restore_signals()
_previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}


def received_signal() -> int | None:
    """The signal that stopped the run, None if none did."""
    return _received[0] if _received else None


def stop_on_signals() -> None:
    """Raise KeyboardInterrupt on the first SIGINT / SIGTERM; later ones are logged and ignored, so
    that the shutdown they would interrupt still finishes (SIGKILL still ends everything at once)."""
    if threading.current_thread() is not threading.main_thread():
        return  # Python delivers signals to the main thread only; a driver run from a thread keeps the defaults
    _received.clear()

    def handler(signum, frame):
        if _received:
            logger.warning("%s: already stopping, the workers are being shut down", signal.Signals(signum).name)
            return
        _received.append(signum)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for signum in STOP_SIGNALS:
        _previous.setdefault(signum, signal.signal(signum, handler))


def restore_signals() -> None:
    """Put back the handlers stop_on_signals replaced (a notebook or test session goes on after run())."""
    for signum, previous in _previous.items():
        signal.signal(signum, previous)
    _previous.clear()
