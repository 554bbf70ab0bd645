"""Reading tool calls from a model's reply (roll_lite/environments/tool_calls.py): the Qwen format, every
malformed call an error in its place; and the example calculator tool."""

import json

import pytest

from roll_lite.environments.example_tools import calculator
from roll_lite.environments.tool_calls import ToolCall, ToolCallError, parse_qwen, read_calls


def call(name, **arguments):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def test_the_qwen_parser_reads_every_block_in_order():
    assert read_calls(parse_qwen, call("calculator", expression="3 * 7")) == [ToolCall("calculator", {"expression": "3 * 7"})]
    reply = (f"<think>maybe {call('nope')}</think>Let me look.\n{call('lookup', key='a')}\n"
             '<tool_call>{"name": "now"}</tool_call> and <tool_call>\n{"name": "calculator", "arguments": {"expression": "1"}}')
    assert read_calls(parse_qwen, reply) == [ToolCall("lookup", {"key": "a"}), ToolCall("now", {}),  # no arguments: {}
                                             ToolCall("calculator", {"expression": "1"})]  # open at the end: read to it
    assert read_calls(parse_qwen, "The answer is 42.") == []
    assert read_calls(parse_qwen, f"<think>{call('calculator', expression='1')}</think> 42") == []  # only thought of


@pytest.mark.parametrize("block, error", [
    ('{"name": "calculator", "arguments": {"expression": "1"}', "the tool call is not valid JSON (Expecting ',' delimiter"),
    ("", "the tool call is not valid JSON (Expecting value"),
    ('{"arguments": {"expression": "1"}}', 'the tool call has no "name" (a string)'),
    ('{"name": 7}', 'the tool call has no "name" (a string)'),
    ('{"name": "calculator", "arguments": "1 + 1"}', 'the "arguments" of calculator are a string, not a JSON object'),
    ('{"name": "calculator", "arguments": [1]}', 'the "arguments" of calculator are an array, not a JSON object'),
    ('["calculator"]', 'a tool call is a JSON object with "name" and "arguments", not an array'),
])
def test_a_malformed_call_is_an_error_in_its_place(block, error):
    calls = read_calls(parse_qwen, f"<tool_call>{block}</tool_call>{call('lookup', key='a')}")
    assert isinstance(calls[0], ToolCallError) and str(calls[0]).startswith(error), calls[0]
    assert calls[1:] == [ToolCall("lookup", {"key": "a"})]  # the well-formed one next to it still counts


def test_the_calculator_does_arithmetic_and_nothing_else():
    assert [calculator(e) for e in ("3 * 7", " -2 ** 3 + 10 % 4", "7 / 2", "(1 + 2) * 3.5", "2 ** -1")] == [
        "21", "-6", "3.5", "10.5", "0.5"]
    for expression, error in (
            ("__import__('os')", "only numbers and + - * / // % ** are allowed, not \"__import__('os')\""),
            ("x + 1", "only numbers and + - * / // % ** are allowed, not 'x'"),
            ("'a' * 3", "only numbers and + - * / // % ** are allowed, not \"'a'\""),
            ("1 +", "cannot read '1 +' as arithmetic"),
            ("9 ** 9 ** 9", "the exponent 387420489 is too large (at most 1000)")):
        with pytest.raises(ValueError) as raised:
            calculator(expression)
        assert str(raised.value) == error
