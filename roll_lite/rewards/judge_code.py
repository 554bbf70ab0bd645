"""A judge's code of your own, `reward.judge_parser` (reply -> float or None) and a Jinja
`reward.judge_template`, run in a guarded child process: a call that hangs, raises or crashes costs its
row, never the step. The built-in parsers and templates are ours, bounded, and run inline (judge.py).

One batch's calls run at once, a thread per row in the child, and share one deadline: `timeout_s`
(reward.timeout_s) after the batch was sent. A row whose call has not answered by then is `timed_out`;
one that raised or returned no finite number is `failed`; a reply the parser finds no verdict in
(None) is `unparseable`. After a timeout or a crash the child is killed, its stuck threads with it, and
started again: a batch costs at most timeout_s plus a restart however many of its rows hang, and no
thread of the reward worker ever runs the user's code. The plumbing is guarded.py's (prints go to the
log; the child dies with its parent, even while user code holds the GIL in C).

    parent -> child  ("load", parser spec or None, template source or None)   child -> parent  ("ready", error)
    parent -> child  ("render", [(prompt, response, answer, extra), ...])  child -> parent  (index, text or Score)
    parent -> child  ("parse", [reply, ...])                                child -> parent  (index, Score)
                                                        (a reply per row, as each call ends, in any order)
"""

from __future__ import annotations

import subprocess
import threading
import time
from functools import partial
from typing import Any, Callable

from roll_lite.rewards.calls import as_score, describe
from roll_lite.rewards.guarded import STARTUP_TIMEOUT_S, Reader, child_pipes, send, start_child, stop_child
from roll_lite.rewards.outcomes import Score, failed, scored, timed_out, unparseable

Row = tuple[str, str, str, dict]  # (prompt as text, response, answer, extra): a template's fields


def compile_template(source: str):
    """A Jinja template in which a field a row does not have raises (never renders as '')."""
    import jinja2

    return jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(source)


def render(template, row: Row) -> str | Score:
    """The judge's user message for one row, or `failed` naming why the template raised."""
    prompt, response, answer, extra = row
    try:
        return template.render(prompt=prompt, response=response, answer=answer, extra=extra)
    except (Exception, SystemExit) as error:  # a user's sys.exit() fails that row only
        return failed(f"judge template: {describe(error)}")


def verdict(parse: Callable[[str], Any], reply: str) -> Score:
    """The parser's score for one reply: `unparseable` for an empty reply or None, `failed` when it
    raised or returned anything but a finite number."""
    if not reply.strip():
        return unparseable("the judge's reply is empty")
    try:
        value = parse(reply)
        if value is None:
            start = reply.strip()[:80].replace("\n", " ")
            return unparseable(f"no verdict in the judge's reply '{start}'")
        return scored(as_score(value))
    except (Exception, SystemExit) as error:
        return failed(f"judge parser: {describe(error)}")


# -- the child ----------------------------------------------------------------------------------


def main() -> None:
    requests, replies = child_pipes()
    reader, lock = Reader(requests), threading.Lock()
    parse: Any = None  # from the parent's first message, "load"
    template: Any = None
    while True:
        try:
            message = reader.read()
        except EOFError:
            return
        if message[0] == "load":
            parse, template, error = _load(*message[1:])
            send(replies, ("ready", error))
            continue
        work = partial(render, template) if message[0] == "render" else partial(verdict, parse)
        for index, item in enumerate(message[1]):
            # daemon: a call that never returns does not keep the child from exiting with its parent
            threading.Thread(target=_answer, args=(replies, lock, index, work, item), daemon=True).start()


def _load(parser: str | None, template: str | None) -> tuple[Any, Any, str | None]:
    """(the parser, the compiled template, None), or an error naming the key that failed to load."""
    from roll_lite.runtime.importing import load_object

    parse = compiled = None
    try:
        if parser is not None:
            parse = load_object(parser)
            if not callable(parse):
                raise TypeError(f"'{parser}' is a {type(parse).__name__}, not a function")
    except (Exception, SystemExit) as error:
        return None, None, f"reward.judge_parser: cannot load it in the judge's guarded process: {describe(error)}"
    try:
        compiled = compile_template(template) if template is not None else None
    except Exception as error:
        return None, None, f"reward.judge_template: {describe(error)}"
    return parse, compiled, None


def _answer(replies: int, lock: threading.Lock, index: int, work: Callable, item) -> None:
    result = work(item)
    with lock:  # one message at a time on the pipe
        send(replies, (index, result))


# -- the parent ---------------------------------------------------------------------------------


class JudgeCode:
    """The judge's handle on the child: `render` and `parse` give a result per row, in order."""

    process: subprocess.Popen | None  # the child (start_child: its stdin and stdout are pipes)

    def __init__(self, parser: str | None, template: str | None, timeout_s: float):
        """Starts the child; `wait_ready` waits for it to load the parser and the template (the caller
        can load its model meanwhile)."""
        self.parser, self.template, self.timeout_s = parser, template, timeout_s
        self.process, self.starts = None, 0
        self._launch()

    def _launch(self) -> None:
        self.process = start_child("roll_lite.rewards.judge_code")
        assert self.process.stdout is not None and self.process.stdin is not None  # start_child's pipes
        self.reader = Reader(self.process.stdout.fileno())
        self.starts += 1
        send(self.process.stdin.fileno(), ("load", self.parser, self.template))

    def wait_ready(self) -> None:
        try:
            _, error = self.reader.read(time.monotonic() + STARTUP_TIMEOUT_S)
        except (TimeoutError, EOFError, OSError):
            self.close()
            raise RuntimeError(
                f"the judge's guarded process (reward.judge_parser={self.parser}) did not start within "
                f"{STARTUP_TIMEOUT_S:g} s; see the log above"
            ) from None
        if error is not None:
            self.close()
            raise RuntimeError(error)

    def render(self, rows: list[Row]) -> list[str | Score]:
        """Each row's user message through the template, or its `failed` / `timed_out` Score."""
        return self._run("render", "template", rows)

    def parse(self, replies: list[str]) -> list[Score]:
        return self._run("parse", "parser", replies)

    def _run(self, kind: str, what: str, items: list) -> list:
        results: list = [None] * len(items)
        if not items:
            return results
        assert self.process is not None and self.process.stdin is not None  # _launch() made it
        try:
            send(self.process.stdin.fileno(), (kind, items))
        except OSError:  # it died between batches
            self.restart()
            send(self.process.stdin.fileno(), (kind, items))
        deadline = time.monotonic() + self.timeout_s
        try:
            for _ in items:
                index, result = self.reader.read(deadline)
                results[index] = result
            return results
        except TimeoutError:
            missing = timed_out(f"judge {what}: no result within reward.timeout_s={self.timeout_s:g} s")
        except (EOFError, OSError):
            missing = failed(f"judge {what}: its process died with exit code {self.process.wait()}")
        self.restart()  # the calls still running die with the process
        return [missing if result is None else result for result in results]

    def restart(self) -> None:
        self.close()
        self._launch()
        self.wait_ready()

    def close(self) -> None:
        if self.process is not None:
            stop_child(self.process)
            self.process = None
