"""The `tools` environment (roll_lite/environments/tools.py): running tool calls, every mistake of the
model answered as an error in a tool message and counted, never a fault, max_tool_calls, the final
answer reaching the task (guess_the_number), the whole wrapper through the runner's processes, and its
observations through a chat template that knows the tool role. Reading the calls from a reply (the Qwen
format and a user's parser): tests/test_tool_calls.py."""

import json
import sys

import pytest
from test_turns import TEMPLATE
from user_modules import user_module as user_module_named

from roll_lite.environments import ENVIRONMENTS, EnvironmentRunner, ToolEnvironment
from roll_lite.environments.example_tools import calculator
from roll_lite.environments.tools import tool_schema
from roll_lite.environments.turns import observation_ids
from roll_lite.model.tokenizer import build_char_tokenizer

CALCULATOR = "roll_lite.environments.example_tools:calculator"

USER_TOOLS = '''
import json

RAN = []

def lookup(key: str, default: int = 0) -> dict:
    """The value stored under key."""
    RAN.append(key)
    return {"key": key, "value": {"a": 1, "b": 2}.get(key, default)}

def broken(x: int) -> str:
    raise RuntimeError("the index is down")

def parse_lines(text):
    """One call per line `CALL name {json arguments}`; a line `CALL` alone cannot be read."""
    calls = []
    for line in text.splitlines():
        if line == "CALL":
            calls.append(ValueError("CALL needs a name"))
        elif line.startswith("CALL "):
            name, _, arguments = line[5:].partition(" ")
            calls.append({"name": name, "arguments": json.loads(arguments or "{}")})
    return calls

def parse_or_raise(text):
    if "oops" in text:
        raise ValueError("write CALL lines")
    if "bug" in text:
        raise KeyError("a bug in the parser")
    return []

class ChatTask:
    """A task whose observations are chat messages, with a system message of its own."""

    def reset(self, seed=None, topic="x"):
        return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"About {topic}?"}], {"r": 1}

    def step(self, action):
        return "noted", 0.5, False, False, {"metrics": {"words": len(action.split())}}
'''


@pytest.fixture(scope="module")
def user_module(tmp_path_factory):
    """A user's module of tools, a parser and a task, importable here and in the runner's processes."""
    with user_module_named(tmp_path_factory, "user_tools", USER_TOOLS) as name:
        yield name


def call(name, **arguments):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def guessing(user_module, **kwargs):
    tools = [CALCULATOR, f"{user_module}:lookup", f"{user_module}:broken"]
    return ToolEnvironment(env="guess_the_number", env_kwargs={"hi": 1000}, tools=tools, **kwargs)


def tool_messages(*contents):
    return [{"role": "tool", "content": content} for content in contents]


# -- running them ----------------------------------------------------------------------------------


def test_the_first_observation_lists_the_tools_before_the_task(user_module):
    env = guessing(user_module)
    observation, info = env.reset(seed=1, secret=21, prompt="a row field the task does not take")
    system, user = observation
    assert user == {
        "role": "user",
        "content": "Guess my number: a whole number from 1 to 1000. You have 8 guesses; "
        "after each one I say higher or lower. Reply with just the number.",
    }
    listed = system["content"].split("<tools>\n")[1].split("\n</tools>")[0].splitlines()
    assert [json.loads(line) for line in listed] == [
        tool_schema("calculator", calculator),
        tool_schema("lookup", sys.modules[user_module].lookup),
        tool_schema("broken", sys.modules[user_module].broken),
    ]
    assert system == {
        "role": "system",
        "content": (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function "
            f"signatures within <tools></tools> XML tags:\n<tools>\n{chr(10).join(listed)}\n</tools>\n\nFor each function "
            "call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        ),
    }
    assert env.reset(seed=1, secret=21) == (observation, info)  # the same every time
    chat = ToolEnvironment(env=f"{user_module}:ChatTask", tools=[CALCULATOR])
    merged, info = chat.reset(topic="tea")
    assert (
        merged[0]["content"].startswith("Be brief.\n\n# Tools\n")
        and merged[1:] == [{"role": "user", "content": "About tea?"}]
        and info == {"r": 1}
    )


def test_a_tool_schema_shows_the_docstring_and_the_parameters_as_json_types(user_module):
    def search(query: str, limit: int = 5, exact: bool = False, tags: "list[str]" = (), *rest, where=None, **more):
        """Search the index.

        Returns the top hits."""

    assert tool_schema("search", search) == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the index.\n\nReturns the top hits.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer"},
                    "exact": {"type": "boolean"},
                    "tags": {"type": "array"},
                    "where": {},
                },
                "required": ["query"],
            },
        },
    }
    assert tool_schema("lookup", sys.modules[user_module].lookup)["function"]["parameters"] == {
        "type": "object",
        "properties": {"key": {"type": "string"}, "default": {"type": "integer"}},
        "required": ["key"],
    }


def test_tool_calls_run_and_the_models_mistakes_come_back_as_counted_errors(user_module):
    env = guessing(user_module)
    env.reset(secret=21)
    reply = "\n".join(
        [
            call("calculator", expression="3 * 7"),
            call("lookup", key="a"),
            call("broken", x=1),
            call("search", query="x"),
            call("calculator", expr="1"),
            call("calculator", expression="1", x=2),
            call("calculator", expression="1 / 0"),
            "<tool_call>{not json</tool_call>",
        ]
    )
    observation, reward, terminated, truncated, info = env.step(reply)
    assert observation == tool_messages(
        "21",
        '{"key": "a", "value": 1}',
        "Error: broken raised RuntimeError: the index is down",
        "Error: there is no tool named 'search'; the tools are calculator, lookup, broken",
        "Error: calculator: missing a required argument: 'expression'",
        "Error: calculator: got an unexpected keyword argument 'x'",
        "Error: calculator raised ZeroDivisionError: division by zero",
        "Error: the tool call is not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 "
        "(char 1))",
    )
    assert (reward, terminated, truncated, info) == (
        0.0,
        False,
        False,
        {"metrics": {"tool_calls": 8, "tool_errors": 6}},
    )


def test_a_calculator_call_then_the_guess_reaches_the_task(user_module):
    env = guessing(user_module)
    env.reset(secret=500)
    assert env.step(f"Half of 1000? {call('calculator', expression='1000 // 2 - 1')}")[:4] == (
        tool_messages("499"),
        0.0,
        False,
        False,
    )
    assert env.step("It is 499.") == (
        "Higher than 499.",
        0.0,
        False,
        False,
        {"turn": 1, "outcome": "higher", "metrics": {"tool_calls": 0, "tool_errors": 0}},
    )
    assert env.step(call("calculator", expression="499 + 1"))[0] == tool_messages("500")  # tools again, mid-task
    assert env.step("<think>the tool said 500</think> \\boxed{500}") == (
        "Correct! It was 500.",
        1.0,
        True,
        False,
        {"turn": 2, "outcome": "correct", "secret": 500, "metrics": {"tool_calls": 0, "tool_errors": 0}},
    )
    chat = ToolEnvironment(env=f"{user_module}:ChatTask", tools=[CALCULATOR])
    chat.reset()
    assert chat.step("two words")[4] == {"metrics": {"words": 2, "tool_calls": 0, "tool_errors": 0}}  # the task's kept


def test_past_max_tool_calls_the_episode_ends_truncated_and_none_of_its_calls_run(user_module):
    env = guessing(user_module, max_tool_calls=3)
    ran = sys.modules[user_module].RAN
    env.reset(secret=7)
    assert env.step(call("lookup", key="a") + call("lookup", key="b"))[4]["metrics"] == {
        "tool_calls": 2,
        "tool_errors": 0,
    }
    del ran[:]
    assert env.step(call("lookup", key="a") + call("calculator", expression="1")) == (
        "Too many tool calls: 2 more would pass the limit of 3 per episode (2 made). The episode ends.",
        0.0,
        False,
        True,
        {"metrics": {"tool_calls": 0, "tool_errors": 0}, "tool_limit_reached": True},
    )
    assert ran == []
    env.reset(secret=7)  # a new episode has its own budget
    assert env.step(call("lookup", key="a") * 3)[4]["metrics"] == {"tool_calls": 3, "tool_errors": 0}
    assert env.step(call("nope"))[3] is True  # errors count towards it too


def test_long_tool_messages_are_cut(user_module):
    env = guessing(user_module, max_result_chars=10)
    env.reset(secret=7)
    assert env.step(call("calculator", expression="10 ** 30"))[0] == tool_messages(
        "1000000000... [cut: 31 characters in all]"
    )
    unlimited = guessing(user_module, max_result_chars=None)
    unlimited.reset(secret=7)
    assert unlimited.step(call("calculator", expression="10 ** 30"))[0] == tool_messages(str(10**30))


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"tools": []}, "tools must be a non-empty list of package.module:function import paths, got []"),
        ({"tools": CALCULATOR}, "tools must be a non-empty list"),
        ({"tools": [CALCULATOR, CALCULATOR]}, "two tools are named 'calculator'; the model calls them by name"),
        ({"tools": ["roll_lite.environments.example_tools:_OPERATORS"]}, "is a dict, not a function"),
        ({"tools": [divmod]}, r"has positional-only parameters \(x, y\); the model passes arguments by name"),
        ({"tools": [CALCULATOR], "max_tool_calls": 0}, "max_tool_calls must be a whole number >= 1, got 0"),
        (
            {"tools": [CALCULATOR], "max_result_chars": 1.5},
            "max_result_chars must be a whole number >= 1 or None, got 1.5",
        ),
    ],
)
def test_a_bad_build_is_named(kwargs, error):
    with pytest.raises((ValueError, TypeError), match=error.replace("[", r"\[").replace("]", r"\]")):
        ToolEnvironment(env="guess_the_number", **kwargs)


def test_the_calculator_does_arithmetic_and_nothing_else():
    assert [calculator(e) for e in ("3 * 7", " -2 ** 3 + 10 % 4", "7 / 2", "(1 + 2) * 3.5", "2 ** -1")] == [
        "21",
        "-6",
        "3.5",
        "10.5",
        "0.5",
    ]
    for expression, error in (
        ("__import__('os')", "only numbers and + - * / // % ** are allowed, not \"__import__('os')\""),
        ("x + 1", "only numbers and + - * / // % ** are allowed, not 'x'"),
        ("'a' * 3", "only numbers and + - * / // % ** are allowed, not \"'a'\""),
        ("1 +", "cannot read '1 +' as arithmetic"),
        ("9 ** 9 ** 9", "the exponent 387420489 is too large (at most 1000)"),
    ):
        with pytest.raises(ValueError) as raised:
            calculator(expression)
        assert str(raised.value) == error


# -- through the runner and a chat template ------------------------------------------------------


def test_the_wrapper_keeps_the_contract_through_the_runners_processes(user_module):
    assert ENVIRONMENTS["tools"] is ToolEnvironment
    kwargs = {
        "env": "guess_the_number",
        "env_kwargs": {"hi": 100},
        "max_tool_calls": 2,
        "tools": [CALCULATOR, f"{user_module}:broken"],
    }
    with EnvironmentRunner("tools", kwargs, max_concurrent=2, step_timeout_s=10.0) as runner:
        first = runner.reset_many([(0, 0, {"secret": 42, "prompt": "p"}), (1, 1, {"secret": 8})])
        assert [r.observation[0]["role"] for r in first] == ["system", "system"] and first[0].fault is None
        results = runner.step_many([(0, call("calculator", expression="6 * 7")), (1, call("broken", x=1))])
        assert [(r.observation, r.reward, r.done, r.info["metrics"]) for r in results] == [
            (tool_messages("42"), 0.0, False, {"tool_calls": 1, "tool_errors": 0}),
            (
                tool_messages("Error: broken raised RuntimeError: the index is down"),
                0.0,
                False,
                {"tool_calls": 1, "tool_errors": 1},
            ),
        ]
        results = runner.step_many([(0, "42"), (1, call("broken", x=1) * 2)])
        assert [(r.observation[:20], r.reward, r.terminated, r.truncated, r.fault) for r in results] == [
            ("Correct! It was 42.", 1.0, True, False, None),
            ("Too many tool calls:", 0.0, False, True, None),
        ]
        assert runner.running() == [] and not any(key.startswith("faults/") for key in runner.stats)


def test_the_observations_tokenize_with_a_template_that_knows_the_tool_role(user_module):
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = TEMPLATE
    env = guessing(user_module)
    first, _ = env.reset(secret=21)
    prompt = tokenizer.apply_chat_template(first, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert tokenizer.decode(prompt).startswith("<bos>system\n# Tools\n") and tokenizer.decode(prompt).endswith(
        "Reply with just the number.<eos>\n<bos>assistant\n"
    )
    observation = env.step(call("calculator", expression="3 * 7") + call("nope"))[0]
    assert tokenizer.decode(observation_ids(tokenizer, observation)) == (
        "\n<bos>tool\n21<eos>\n<bos>tool\nError: there is no tool named 'nope'; the tools are calculator, lookup, "
        "broken<eos>\n<bos>assistant\n"
    )
    assert tokenizer.decode(observation_ids(tokenizer, env.step("20")[0])) == (
        "\n<bos>user\nHigher than 20.<eos>\n<bos>assistant\n"
    )
