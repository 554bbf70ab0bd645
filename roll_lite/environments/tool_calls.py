"""Reading the tool calls in a model's reply, for the `tools` environment (tools.py).

A parser is a function `text -> list of calls`, each call a dict {"name": str, "arguments": dict}.
The built-in one, "qwen", reads the Qwen / Hermes format (what Qwen2.5 and Qwen3 write, and vLLM's
"hermes" tool parser reads):

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "3 * 7"}}
    </tool_call>

A reply may hold several blocks; a block left open at the end of the reply (generation stopped
there) is read to the end. Only the text after the last `</think>` is read, so a call the model
only thinks about is not made. "arguments" may be left out for a tool without any.

A parser of your own is named by its import path (`parser: my_pkg.tools:parse`), and the `tools`
environment then needs `instructions` too: how to write a call in its format. It may put a
ValueError in the list in place of a call it cannot read, or raise one (json.JSONDecodeError is
one) when the reply's calls cannot be read at all, which is one malformed call; the model hears its
message. Any other exception is a bug in the parser, not the model's mistake: the step raises and
its trajectory ends as "raised".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable

_AFTER_THINKING = re.compile(r"</think>", re.IGNORECASE)
_QWEN_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)\Z", re.DOTALL)

# Qwen2.5's and Qwen3's chat templates say it so, after the <tools> list.
QWEN_INSTRUCTIONS = (
    "For each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call>"
)


class ToolCallError(ValueError):
    """A call the model wrote that cannot be run; its message goes back to the model."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


def parse_qwen(text: str) -> list:
    """The calls of the reply's <tool_call> blocks, in order; a ToolCallError for a block that is not JSON."""
    calls = []
    for closed, open_at_end in _QWEN_BLOCK.findall(_AFTER_THINKING.split(text)[-1]):
        block = (closed or open_at_end).strip()
        try:
            calls.append(json.loads(block))
        except json.JSONDecodeError as error:
            calls.append(ToolCallError(f"the tool call is not valid JSON ({error})"))
    return calls


# name -> (parser, the system message's instructions on how to write a call)
PARSERS: dict[str, tuple[Callable, str]] = {"qwen": (parse_qwen, QWEN_INSTRUCTIONS)}


def resolve_parser(spec: str) -> tuple[Callable, str | None]:
    """The parser `spec` names and its instructions (None for a parser of your own)."""
    if spec in PARSERS:
        return PARSERS[spec]
    if ":" not in spec:
        raise KeyError(
            f"unknown tool call parser '{spec}'; built in: {', '.join(sorted(PARSERS))}, "
            "or name a package.module:function"
        )
    from roll_lite.runtime.importing import load_object

    parser = load_object(spec)
    if not callable(parser):
        raise TypeError(f"parser '{spec}' is a {type(parser).__name__}, not a function text -> list of calls")
    return parser, None


def read_calls(parser: Callable, text: str) -> list[ToolCall | ToolCallError]:
    """The reply's calls, each checked: a ToolCall, or a ToolCallError saying what is wrong with it."""
    try:
        parsed = parser(text)
    except ValueError as error:  # the reply's calls cannot be read at all: one malformed call
        return [checked_call(error)]
    if not isinstance(parsed, (list, tuple)):
        raise TypeError(f"the tool call parser returned a {type(parsed).__name__}, not a list of calls")
    return [checked_call(call) for call in parsed]


def checked_call(call) -> ToolCall | ToolCallError:
    if isinstance(call, ValueError):
        return call if isinstance(call, ToolCallError) else ToolCallError(str(call))
    if not isinstance(call, dict):
        return ToolCallError(f'a tool call is a JSON object with "name" and "arguments", not {_json_type(call)}')
    name, arguments = call.get("name"), call.get("arguments", {})
    if not isinstance(name, str) or not name:
        return ToolCallError('the tool call has no "name" (a string)')
    if not isinstance(arguments, dict):
        return ToolCallError(f'the "arguments" of {name} are {_json_type(arguments)}, not a JSON object')
    return ToolCall(name, arguments)


def _json_type(value) -> str:
    names = {str: "a string", list: "an array", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), f"a {type(value).__name__}")
