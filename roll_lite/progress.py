"""Progress bars on a terminal, plain log lines elsewhere (CI, `ray job` logs, a file).

The bars are drawn on stderr, where the log lines go; they are shown only when stderr is a
terminal. `use_terminal_logging` routes log records through tqdm.write so that a line printed
while a bar is drawn appears above it instead of breaking it.
"""

from __future__ import annotations

import logging
import sys
import weakref

from tqdm import tqdm

_bars: "weakref.WeakSet[tqdm]" = weakref.WeakSet()  # every bar made here, to close those an exception left open


def on_terminal() -> bool:
    return sys.stderr.isatty()


def progress_bar(total: int, description: str, unit: str = "step", show: bool = True) -> tqdm:
    """A bar counting to `total` (call .update(), then .close()); does nothing off a terminal."""
    bar = tqdm(total=total, desc=description, unit=unit, file=sys.stderr, disable=not (show and on_terminal()),
               dynamic_ncols=True, leave=False)
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
