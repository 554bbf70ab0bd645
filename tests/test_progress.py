"""Progress bars: drawn on a terminal, absent elsewhere; log lines printed above a bar, not into it.
(tests/test_failures.py sees the same through roll-train in a pseudo-terminal and in a pipe.) Off a
terminal no colour codes; the run's "N s in all" counts from the start of roll-train."""

import io
import logging
import re
import subprocess
import sys
import time

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


def test_roll_train_into_a_file_writes_no_ansi_codes_and_counts_all_its_time(tmp_path):
    """A tiny run, its output (stdout and stderr) a file. Its worker prints (transformers' "Writing
    model shards" when final/ is saved), which Ray forwards with a coloured `(ModelWorker pid=...)`
    prefix unless the driver takes the colours out. "N s in all" counts from the process start: at
    least the time until the first step, Ray's start and the workers' included."""
    from test_pipeline_ray import REPO, small

    log = tmp_path / "roll_train.log"
    command = [
        sys.executable,
        "-m",
        "roll_lite.cli",
        "--config",
        str(REPO / "configs/ppo.yaml"),
        *small(tmp_path),
        "steps=2",
        "eval_every=2",
        "save_model=true",
        f"output_dir={tmp_path}",
        "run_name=run",
    ]
    with log.open("w") as output:
        start = time.monotonic()
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, cwd=tmp_path)
        first_step = None
        while process.poll() is None:
            if first_step is None and "step 1/2 |" in log.read_text(errors="replace"):
                first_step = time.monotonic() - start
            time.sleep(0.05)
    text = log.read_text()
    assert process.returncode == 0, text[-3000:]
    assert "(ModelWorker" in text  # a forwarded worker line: what Ray colours
    assert "\x1b[" not in text, [line for line in text.splitlines() if "\x1b[" in line][:3]
    in_all = float(re.search(r"; ([0-9.]+) s in all; run dir", text).group(1))
    assert first_step is not None and in_all >= first_step, (in_all, first_step)
    assert in_all <= time.monotonic() - start


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
