"""Progress bars: drawn on a terminal, absent elsewhere; log lines printed above a bar, not into it.
(tests/test_failures.py sees the same through roll-train in a pseudo-terminal and in a pipe.) Off a
terminal no colour codes; tests/test_docs.py checks a real run's log file for them, and that its "N s in
all" counts from the start of roll-train."""

import io
import logging
import sys

import pytest

from roll_lite.runtime.progress import TqdmLogHandler, close_bars, progress_bar


@pytest.fixture(autouse=True)
def no_bars_left():
    yield
    close_bars()


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_no_bar_when_stderr_is_not_a_terminal(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    bar = progress_bar(3, "RL")
    for _ in range(3):
        bar.update()
    bar.close()
    assert stream.getvalue() == ""


def test_a_bar_on_a_terminal_counts_and_log_lines_go_above_it(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    logger = logging.getLogger("test_progress")
    logger.addHandler(TqdmLogHandler(terminal))
    try:
        bar = progress_bar(3, "RL")
        bar.update()
        bar.refresh()  # tqdm redraws at most every 0.1 s by itself
        logger.warning("step 1/3 | reward 0.5")
        bar.update()
        bar.refresh()
    finally:
        logger.handlers.clear()
    text = terminal.getvalue()
    assert "RL:" in text and "1/3" in text
    # the bar is erased ("\r" + blanks + "\r"), the line is written whole, then the bar is drawn again
    before, after = text.split("step 1/3 | reward 0.5\n")
    assert before.endswith("\r") and "RL:" in after and "2/3" in after


def test_close_bars_erases_a_bar_an_exception_left_open(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    bar = progress_bar(5, "warm start")
    bar.update()
    bar.refresh()
    close_bars()
    assert bar.disable  # tqdm marks a closed bar disabled
    assert terminal.getvalue().endswith("\r")  # the line was blanked: a last message starts at its beginning


def test_off_a_terminal_ansi_codes_are_taken_out_and_on_one_they_stay(monkeypatch):
    from roll_lite.runtime.progress import WithoutAnsi, plain_text_off_terminal

    pipe, terminal = io.StringIO(), Terminal()
    for stream in (pipe, terminal):
        monkeypatch.setattr(sys, "stderr", stream)
        plain_text_off_terminal()
        print("\x1b[36m(ModelWorker pid=1)\x1b[0m saved \x1b[32m[repeated 2x across cluster]\x1b[0m", file=sys.stderr)
    assert pipe.getvalue() == "(ModelWorker pid=1) saved [repeated 2x across cluster]\n"
    assert terminal.getvalue().startswith("\x1b[36m(ModelWorker pid=1)\x1b[0m")
    assert not isinstance(sys.stderr, WithoutAnsi)  # the terminal was left as it is
