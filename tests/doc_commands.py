"""What the README and the docs show, for the tests that run it: their text, fenced code blocks and
command lines (a line ending in a backslash continues on the next one; a ` # comment` is dropped).

README.md, CONTRIBUTING.md and docs/**/*.md are read together, so a command keeps its test when it moves between
them. A fenced block right after `<!-- not run here: REASON -->` is marked as not run by the test
suite (tests/test_docs.py allows only the ones it lists)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(
    r"(?:<!--\s*not run here:\s*(?P<reason>.*?)\s*-->\s*\n)?^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```", re.S | re.M
)


@dataclass
class Block:
    path: str  # relative to the repository root
    lang: str
    body: str
    not_run: str | None  # the reason given in a `<!-- not run here: ... -->` comment right above it


def doc_files() -> list[Path]:
    return [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").rglob("*.md"))]


def doc_text() -> str:
    """README.md, CONTRIBUTING.md and every page under docs/, one after the other."""
    return "\n\n".join(path.read_text() for path in doc_files())


def blocks(paths: list[Path] | None = None, lang: str | None = None) -> list[Block]:
    found = []
    for path in paths or doc_files():
        for match in FENCE.finditer(path.read_text()):
            if lang is None or match["lang"] == lang:
                found.append(Block(path.relative_to(REPO).as_posix(), match["lang"], match["body"], match["reason"]))
    return found


def command_lines(body: str) -> list[str]:
    """The shell command lines of a block: continuations joined, comments and blank lines dropped."""
    lines, current = [], ""
    for raw in body.splitlines():
        line = raw.split(" # ")[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            current += line[:-1].strip() + " "
            continue
        line = (current + line.strip()).strip()
        current = ""
        if line:
            lines.append(line)
    return lines


def commands(program: str, contains: str = "", inline: bool = False) -> list[str]:
    """Command lines starting with `program` in the README's and the docs' code blocks (and, with
    `inline`, in their `inline code` too), that contain `contains`."""
    lines = [line for block in blocks() for line in command_lines(block.body)]
    if inline:
        prose = re.sub(r"```.*?```", "", doc_text(), flags=re.S)
        lines += [code.split(" # ")[0].strip() for code in re.findall(r"`([^`\n]+)`", prose)]
    return [line for line in lines if line.startswith(program + " ") and contains in line]


def command(program: str, contains: str = "") -> list[str]:
    """The first such command, as argv; fails naming what the docs no longer show."""
    found = commands(program, contains)
    assert found, f"README.md / docs no longer show a `{program} ...{contains}...` command"
    return shlex.split(found[0])


def python_blocks_defining(name: str) -> list[Block]:
    """The ```python blocks that define `name` (e.g. `def my_loss(`)."""
    return [block for block in blocks(lang="python") if re.search(rf"^def {re.escape(name)}\(", block.body, re.M)]
