"""The configuration reference's generator (roll_lite/config/reference.py): it lists every key of the
config dataclasses with its default and comment, and reads the comments above a field, after it and
shared by a group of fields. That docs/configuration.md is what it renders: tests/test_docs.py."""

from __future__ import annotations

import dataclasses
import html
import inspect
import re
from dataclasses import dataclass, field
from typing import Optional

import yaml


def reference_rows(markdown: str) -> dict[str, tuple[str, str, str]]:
    """`dotted.key` -> (type, default as written, description) from the rendered tables."""
    rows = {}
    for line in markdown.splitlines():
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 4 and cells[0].startswith("`") and cells[0] != "`key`":
            rows[cells[0].strip("`")] = (
                cells[1],
                cells[2].strip("`").replace("\\|", "|"),
                html.unescape(cells[3].replace("\\|", "|")),
            )
    return rows


def leaf_fields(instance, prefix=""):
    """(dotted key, value, owning class, field name) for every non-dataclass field, recursively."""
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        if dataclasses.is_dataclass(value):
            yield from leaf_fields(value, prefix + f.name + ".")
        else:
            yield prefix + f.name, value, type(instance), f.name


def inline_comments(cls) -> dict[str, str]:
    """field -> the comment on its own line, read from the source with a plain regex."""
    found = {}
    for line in inspect.getsource(cls).splitlines():
        match = re.match(r"\s{4}(\w+): [^#]*?#\s*(.+)$", line)
        if match and "'" not in line.split("#")[0] and '"#' not in line:
            found[match[1]] = match[2].strip()
    return found


def test_the_configuration_reference_lists_every_key_with_its_default_and_comment():
    from roll_lite.config import RunConfig
    from roll_lite.config.reference import render

    rows = reference_rows(render())
    keys = list(leaf_fields(RunConfig()))
    assert len(keys) > 100
    for key, value, cls, name in keys:
        assert key in rows, f"{key} is missing from the configuration reference"
        assert yaml.safe_load(rows[key][1]) == value, (key, rows[key][1], value)
        comment = inline_comments(cls).get(name)
        if comment:
            assert comment in rows[key][2], (key, comment, rows[key][2])
    assert set(rows) == {key for key, *_ in keys}
    # comments on the lines above a field, continued below it, and shared by a group of fields
    assert "strictly on-policy" in rows["rollout.async_steps"][2]
    assert rows["sft.response_key"][2].endswith("and the loss is on every assistant turn")
    assert "after call_timeout_s stops" in rows["workers.stall_warning_s"][2]
    assert rows["actor.lr"][1] != rows["critic.lr"][1]  # each section's own defaults


@dataclass
class _Inner:
    """The inner section."""

    alpha: int = 1  # the alpha,
    # continued here
    beta: Optional[float] = None

    # about gamma and delta
    gamma: str = "auto"
    delta: bool = True
    epsilon: list = field(default_factory=list)  # its own


@dataclass
class _Outer:
    name: str = "x"  # a name
    inner: _Inner = field(default_factory=_Inner)


def test_the_generator_reads_comments_above_after_and_shared():
    from roll_lite.config.reference import field_comments, render

    assert field_comments(_Inner) == {
        "alpha": "the alpha, continued here",
        "gamma": "about gamma and delta",
        "delta": "about gamma and delta",
        "epsilon": "its own",
    }
    rows = reference_rows(render(_Outer()))
    assert rows["inner.beta"] == ("float or null", "null", "")
    assert rows["inner.gamma"][1] == "auto" and rows["inner.delta"][1] == "true" and rows["inner.epsilon"][1] == "[]"
    assert rows["name"] == ("str", "x", "a name")
    assert "The inner section." in render(_Outer())
