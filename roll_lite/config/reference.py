"""The configuration reference, rendered as Markdown from the config dataclasses themselves.

Every key of the run config (`RunConfig` and the dataclasses it nests: `rollout.max_new_tokens`, ...)
with its type, its default (as a fresh `RunConfig()` holds it, so a section built with other defaults,
e.g. `actor` and `critic` from one `StrategyConfig`, shows its own) and its comment. Comments are the
`#` comments of the class source, found with `inspect` + `tokenize` wherever the class lives:

- a comment after a field, on the field's line;
- the comment lines just above a field (a block): they describe it, and also the fields right after
  it that have no comment of their own (`call_timeout_s` and `stall_warning_s` share one block);
- comment lines right after a field whose own comment ends mid-sentence (`,` `;` `(` ...) continue it.

A class docstring introduces its section. The docs build renders this page at build time
(docs/hooks.py), so it cannot drift from the code; `python -m roll_lite.config.reference` prints it.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import textwrap
import tokenize
import typing
from typing import Any

CONTINUES = (",", ";", ":", "(", "-", "/", "—", " and", " or")


@dataclasses.dataclass
class Key:
    """One config key: its dotted name, type, default and comment."""

    name: str
    type: str
    default: Any
    comment: str


@dataclasses.dataclass
class Section:
    """One dataclass of the config (the top level, `rollout`, `actor`, ...) and its keys."""

    prefix: str
    cls: type
    doc: str
    keys: list[Key]


def field_comments(cls: type) -> dict[str, str]:
    """{field name: comment} from the class source's `#` comments (see the module docstring)."""
    source = textwrap.dedent(inspect.getsource(cls))
    inline: dict[int, str] = {}  # line -> the comment after code on that line
    alone: dict[int, str] = {}  # line -> a line holding only a comment
    code_lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        line = token.start[0]
        if token.type == tokenize.COMMENT:
            text = token.string.lstrip("#").strip()
            (inline if line in code_lines else alone)[line] = text
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.add(line)
    fields = {f.name for f in dataclasses.fields(cls)}
    lines = source.splitlines()
    comments: dict[str, str] = {}
    block: list[str] = []  # comment lines seen since the last field or blank line
    previous: str | None = None  # the last field, while comment lines may still continue its comment
    shared: str = ""  # a block comment that fields without one of their own inherit
    for number, text in enumerate(lines, start=1):
        stripped = text.strip()
        if number in alone:
            block.append(alone[number])
            continue
        name = stripped.split(":", 1)[0].strip() if ":" in stripped else ""
        if name in fields and number in code_lines and text.startswith(" ") and not text.startswith(" " * 5):
            if block and previous and comments.get(previous, "").endswith(CONTINUES):
                comments[previous] += " " + " ".join(block)
                block = []
            own = inline.get(number, "")
            if block:
                shared = " ".join(block)
                comments[name] = shared + (" " + own if own else "")
            elif own:
                shared = ""
                comments[name] = own
            elif shared:
                comments[name] = shared
            block, previous = [], name
        elif not stripped:  # a blank line ends a group of fields that share a block comment
            if block and previous and comments.get(previous, "").endswith(CONTINUES):
                comments[previous] += " " + " ".join(block)
            block, previous, shared = [], None, ""
        else:
            if block and previous and comments.get(previous, "").endswith(CONTINUES):
                comments[previous] += " " + " ".join(block)
            block, previous = [], None
    return {name: text for name, text in comments.items() if text}


def type_name(annotation: Any) -> str:
    """`Optional[int]` -> 'int or null', `list[str]` -> 'list[str]', `Any` -> 'any'."""
    if annotation is Any:
        return "any"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Union or (origin is not None and origin.__name__ == "UnionType"):
        names = [type_name(arg) for arg in args if arg is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in args else "")
    if origin is not None:
        return f"{origin.__name__}[{', '.join(type_name(arg) for arg in args)}]"
    return getattr(annotation, "__name__", str(annotation))


def yaml_value(value: Any) -> str:
    """A default as one would write it in YAML (and as yaml.safe_load reads it back)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        text = repr(value)
        return text.replace("e", ".0e") if "e" in text and "." not in text else text
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {yaml_value(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(item) for item in value) + "]"
    if isinstance(value, str) and (value == "" or value.lower() in ("null", "true", "false", "none")):
        return repr(value)
    return str(value)


def sections(root: Any = None) -> list[Section]:
    """The config as sections: the root's own keys first, then each nested dataclass, depth first."""
    if root is None:
        from roll_lite.config import RunConfig

        root = RunConfig()
    found: list[Section] = []

    def walk(instance: Any, prefix: str) -> None:
        cls = type(instance)
        hints = typing.get_type_hints(cls)
        comments = field_comments(cls)
        own, nested = [], []
        for f in dataclasses.fields(cls):
            value = getattr(instance, f.name)
            if dataclasses.is_dataclass(value):
                nested.append((value, prefix + f.name + "."))
            else:
                own.append(Key(prefix + f.name, type_name(hints[f.name]), value, comments.get(f.name, "")))
        doc = inspect.getdoc(cls) or ""
        if doc.startswith(cls.__name__ + "("):  # the signature dataclasses writes when there is no docstring
            doc = ""
        found.append(Section(prefix.rstrip("."), cls, doc, own))
        for value, nested_prefix in nested:
            walk(value, nested_prefix)

    walk(root, "")
    return found


def _text(text: str) -> str:
    """Markdown-safe prose: `<output_dir>` must not read as an HTML tag."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cell(text: str) -> str:
    return _text(text).replace("|", "\\|").replace("\n", " ")


def _code_cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(root: Any = None) -> str:
    """The whole reference page as Markdown."""
    out = [
        "# Configuration reference",
        "",
        "Every key of a run's config, generated from the config dataclasses "
        "by `python -m roll_lite.config.reference > docs/configuration.md` (tests/test_docs.py checks that "
        "this file is what the code renders), with the defaults of the dataclasses. A YAML file "
        "(`roll-train --config FILE`) sets some of them (`configs/ppo.yaml`, the embedded CPU default, "
        "sets the demo's data, warm start and algorithm), and `key=value` overrides come last. "
        "An unknown key or a bad value stops `roll-train` with one line naming the key (exit code 2).",
        "",
    ]
    for section in sections(root):
        title = f"`{section.prefix}`" if section.prefix else "Top level"
        out += [f"## {title}", ""]
        out.append(f"`{section.cls.__name__}` ({section.cls.__module__}).")
        out.append("")
        if section.doc:
            out += [_text(section.doc), ""]
        out += ["| key | type | default | description |", "|---|---|---|---|"]
        for key in section.keys:
            out.append(
                f"| `{key.name}` | {_cell(key.type)} | `{_code_cell(yaml_value(key.default))}` | {_cell(key.comment)} |"
            )
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(render())
