"""Progress bars on a terminal, plain log lines elsewhere (CI, `ray job` logs, a file).

The bars are drawn on stderr, where the log lines go; they are shown only when stderr is a
terminal. `use_terminal_logging` routes log records through tqdm.write so that a line printed
while a bar is drawn appears above it instead of breaking it. Off a terminal, `plain_text_off_terminal`
takes the colour codes out. The run's "N s in all" counts from the start of roll-train (`start_clock`).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
import weakref
from pathlib import Path

from tqdm import tqdm

_bars: "weakref.WeakSet[tqdm]" = weakref.WeakSet()  # every bar made here, to close those an exception left open


def on_terminal() -> bool:
    return sys.stderr.isatty()


def progress_bar(total: int, description: str, unit: str = "step", show: bool = True) -> tqdm:
    """A bar counting to `total` (call .update(), then .close()); does nothing off a terminal."""
    bar = tqdm(
        total=total,
        desc=description,
        unit=unit,
        file=sys.stderr,
        disable=not (show and on_terminal()),
        dynamic_ncols=True,
        leave=False,
    )
    _bars.add(bar)
    return bar


def close_bars() -> None:
    """Erase the bars still drawn (a run stopped by an error or a signal), before a last message."""
    for bar in list(_bars):
        bar.close()


class TqdmLogHandler(logging.StreamHandler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:
            self.handleError(record)


def use_terminal_logging(level: int = logging.INFO, fmt: str = "%(message)s", datefmt: str | None = None) -> None:
    """logging.basicConfig, through tqdm.write when stderr is a terminal."""
    handler = TqdmLogHandler(sys.stderr) if on_terminal() else logging.StreamHandler(sys.stderr)
    logging.basicConfig(level=level, format=fmt, datefmt=datefmt, handlers=[handler])


ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")  # colours, cursor moves: CSI sequences


class WithoutAnsi:
    """A text stream that passes everything on to `stream` but ANSI escape sequences."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(ANSI_ESCAPE.sub("", text))
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def plain_text_off_terminal() -> None:
    """sys.stdout / sys.stderr that are not a terminal (a file, a pipe, `ray job` logs) lose ANSI escape
    sequences. Ray colours what it prints whatever the output is: the `(ModelWorker pid=...)` prefix
    of every forwarded worker line (RAY_COLOR_PREFIX=0 spares only that one), its "[repeated Nx across
    cluster]" notes, the task names in the exception texts a worker failure quotes."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, WithoutAnsi) and not stream.isatty():
            setattr(sys, name, WithoutAnsi(stream))


_started: float | None = None  # time.monotonic() at the start of roll-train (start_clock)


def process_start() -> float:
    """When this process started, on time.monotonic()'s clock (the interpreter's start and the imports
    count); now where /proc is not there to say."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf(
            "SC_CLK_TCK"
        )  # field 22: starttime
    except (OSError, ValueError, IndexError, AttributeError):
        age = 0.0
    return time.monotonic() - max(age, 0.0)


def start_clock(at: float) -> None:
    """roll-train started at `at` (time.monotonic()): a run's "N s in all" counts from there."""
    global _started
    _started = at


def seconds_in_all(run_start: float) -> float:
    """Seconds since roll-train started, or since `run_start` (the start of a pipeline's run(), which
    Python code may call without roll-train), whichever came first."""
    return time.monotonic() - min(run_start, _started if _started is not None else run_start)
