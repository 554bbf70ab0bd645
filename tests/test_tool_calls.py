"""Reading tool calls from a reply (roll_lite/environments/tool_calls.py): the Qwen format block by
block, a malformed call as an error in its place, and a user's parser by import path, answered in tool
messages (the user's module of tools and the environment around it: tests/test_tools.py)."""

import pytest
from test_tools import CALCULATOR, call, tool_messages, user_module  # noqa: F401 (user_module: a fixture)

from roll_lite.environments import ToolEnvironment
from roll_lite.environments.tool_calls import ToolCall, ToolCallError, parse_qwen, read_calls


def test_the_qwen_parser_reads_every_block_in_order():
    assert read_calls(parse_qwen, call("calculator", expression="3 * 7")) == [
        ToolCall("calculator", {"expression": "3 * 7"})
    ]
    reply = (
        f"<think>maybe {call('nope')}</think>Let me look.\n{call('lookup', key='a')}\n"
        '<tool_call>{"name": "now"}</tool_call> and <tool_call>\n{"name": "calculator", "arguments": {"expression": "1"}}'
    )
    assert read_calls(parse_qwen, reply) == [
        ToolCall("lookup", {"key": "a"}),
        ToolCall("now", {}),  # no arguments: {}
        ToolCall("calculator", {"expression": "1"}),
    ]  # open at the end: read to it
    assert read_calls(parse_qwen, "The answer is 42.") == []
    assert read_calls(parse_qwen, f"<think>{call('calculator', expression='1')}</think> 42") == []  # only thought of


@pytest.mark.parametrize(
    "block, error",
    [
        (
            '{"name": "calculator", "arguments": {"expression": "1"}',
            "the tool call is not valid JSON (Expecting ',' delimiter",
        ),
        ("", "the tool call is not valid JSON (Expecting value"),
        ('{"arguments": {"expression": "1"}}', 'the tool call has no "name" (a string)'),
        ('{"name": 7}', 'the tool call has no "name" (a string)'),
        (
            '{"name": "calculator", "arguments": "1 + 1"}',
            'the "arguments" of calculator are a string, not a JSON object',
        ),
        ('{"name": "calculator", "arguments": [1]}', 'the "arguments" of calculator are an array, not a JSON object'),
        ('["calculator"]', 'a tool call is a JSON object with "name" and "arguments", not an array'),
    ],
)
def test_a_malformed_call_is_an_error_in_its_place(block, error):
    calls = read_calls(parse_qwen, f"<tool_call>{block}</tool_call>{call('lookup', key='a')}")
    assert isinstance(calls[0], ToolCallError) and str(calls[0]).startswith(error), calls[0]
    assert calls[1:] == [ToolCall("lookup", {"key": "a"})]  # the well-formed one next to it still counts


def test_a_users_parser_by_import_path(user_module):
    env = ToolEnvironment(
        env="guess_the_number",
        tools=[f"{user_module}:lookup"],
        parser=f"{user_module}:parse_lines",
        instructions="Write CALL name {arguments}.",
    )
    first, _ = env.reset(secret=3)
    assert first[0]["content"].endswith("</tools>\n\nWrite CALL name {arguments}.")
    observation, reward, terminated, truncated, info = env.step('CALL lookup {"key": "b"}\nCALL\nCALL lookup')
    assert observation == tool_messages(
        '{"key": "b", "value": 2}', "Error: CALL needs a name", "Error: lookup: missing a required argument: 'key'"
    )
    assert info["metrics"] == {"tool_calls": 3, "tool_errors": 2}
    assert env.step("3")[:3] == ("Correct! It was 3.", 1.0, True)  # no CALL line: the final answer

    raising = ToolEnvironment(
        env="guess_the_number", tools=[CALCULATOR], parser=f"{user_module}:parse_or_raise", instructions="..."
    )
    raising.reset(secret=3)
    assert raising.step("oops")[0] == tool_messages("Error: write CALL lines")  # a ValueError: one malformed call
    with pytest.raises(KeyError, match="a bug in the parser"):  # anything else is the parser's bug: a fault
        raising.step("bug")
    with pytest.raises(
        ValueError, match=f"parser '{user_module}:parse_lines' reads a format of its own: give `instructions`"
    ):
        ToolEnvironment(env="guess_the_number", tools=[CALCULATOR], parser=f"{user_module}:parse_lines")
    with pytest.raises(KeyError, match="unknown tool call parser 'hermes'; built in: qwen, or name a package"):
        ToolEnvironment(env="guess_the_number", tools=[CALCULATOR], parser="hermes")
