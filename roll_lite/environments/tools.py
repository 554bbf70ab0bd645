"""`tools`: any environment, with tools the model may call before it answers.

    environment:
      name: tools
      kwargs:
        env: guess_the_number                  # the task: a registered name or package.module:Class
        env_kwargs: {hi: 1000}
        tools: ["roll_lite.environments.example_tools:calculator", "my_pkg.tools:search"]
        parser: qwen                           # or my_pkg.tools:parse (tool_calls.py)
        max_tool_calls: 8                      # per episode
        max_result_chars: 2000                 # a longer tool message is cut there

A tool is a plain Python function, named by its import path; the model calls it by the function's
name, with its arguments by name. Built with:

- `env`, `env_kwargs`: the task environment and its kwargs; `reset`'s row fields go to it (those its
  reset takes), and so does every reply without a tool call.
- `tools`: the functions; the model is shown each one's name, docstring and parameters (their
  annotations as JSON types: str is "string", int "integer", float "number", ...).
- `parser`: how calls are read from a reply, "qwen" (<tool_call> blocks) or a function of your own
  (tool_calls.py says how to write one), which then needs `instructions` too.
- `instructions`: how to write a call, as the system message says it; the parser's by default.
- `max_tool_calls` (default 8): the calls of one episode; a reply whose calls would pass it ends the
  episode as truncated (none of them run, reward 0), its observation saying so.
- `max_result_chars` (default 2000, null: no limit): tool messages are cut to it.

reset: the task's reset; its observation becomes chat messages, a system message that lists the tools
(Qwen2.5's own tool prompt: the tools as JSON in <tools></tools>, then `instructions`), then the
task's observation as a user message (a task whose observation is chat messages keeps them, its
system message's text going before the tools'):

    [{"role": "system", "content": "# Tools\\n\\nYou may call one or more functions ... <tools>\\n
      {\"type\": \"function\", \"function\": {\"name\": \"calculator\", \"description\": ...,
      \"parameters\": {...}}}\\n</tools>\\n\\nFor each function call, ..."},
     {"role": "user", "content": "Guess my number: ..."}]

step(reply): a reply with tool calls runs them in order and returns one tool message per call,
[{"role": "tool", "content": what the tool returned}, ...] (a str as it is, anything else as JSON),
with reward 0, not terminated. A call that cannot be run is the model's mistake, never a fault: it
is answered in its tool message with "Error: ..." saying why (not JSON, no name, arguments not an
object, no such tool, arguments the function does not take, the tool raised). A reply without a
tool call is the final answer: the task's step gets it and its result is returned as it is (if the
task goes on, the next replies may call tools again).

Every step's info has "metrics": {"tool_calls": calls answered, "tool_errors": those answered with
an error} (the task's own metrics kept), which the rollout loop logs as env/tool_calls and
env/tool_errors; the step ended by max_tool_calls also has "tool_limit_reached": True.

The tools run in the environment's process, inside its step: a tool that hangs or kills its process
is caught by the runner's step_timeout_s, as any step is, and ends that trajectory. A trajectory
whose process is restarted for a neighbour's fault is replayed (runner.py), so tools should give the
same results for the same calls (a search over a fixed index does; a live web search does not).
"""

from __future__ import annotations

import inspect
import json

from roll_lite.environments.contract import checked_reset, checked_step, reset_parameters
from roll_lite.environments.registry import register_environment, resolve_environment
from roll_lite.environments.tool_calls import ToolCall, ToolCallError, read_calls, resolve_parser
from roll_lite.rewards.calls import describe

_JSON_TYPES = {
    "str": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "list": "array",
    "tuple": "array",
    "dict": "object",
}
_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
    "with function signatures within <tools></tools> XML tags:\n<tools>\n"
)


@register_environment("tools")
class ToolEnvironment:
    def __init__(
        self,
        env: str,
        tools: list,
        env_kwargs: dict | None = None,
        parser: str = "qwen",
        instructions: str | None = None,
        max_tool_calls: int = 8,
        max_result_chars: int | None = 2000,
    ):
        if not _is_whole(max_tool_calls) or max_tool_calls < 1:
            raise ValueError(f"max_tool_calls must be a whole number >= 1, got {max_tool_calls!r}")
        if max_result_chars is not None and (not _is_whole(max_result_chars) or max_result_chars < 1):
            raise ValueError(f"max_result_chars must be a whole number >= 1 or None, got {max_result_chars!r}")
        self.max_tool_calls, self.max_result_chars = max_tool_calls, max_result_chars
        self.tools = _resolve_tools(tools)
        self.parser, parser_instructions = resolve_parser(parser)
        if instructions is None and parser_instructions is None:
            raise ValueError(
                f"parser '{parser}' reads a format of its own: give `instructions`, the text that tells "
                "the model how to write a call in it"
            )
        schemas = "\n".join(
            json.dumps(tool_schema(name, function), ensure_ascii=False) for name, function in self.tools.items()
        )
        self.tools_prompt = f"{_TOOLS_HEADER}{schemas}\n</tools>\n\n{instructions or parser_instructions}"
        task_class = resolve_environment(env)
        self.task_fields = reset_parameters(task_class)
        self.task = task_class(**dict(env_kwargs or {}))
        self.calls_made: int | None = None  # this episode's; None before the first reset

    def reset(self, seed: int | None = None, **fields) -> tuple[list[dict], dict]:
        if self.task_fields is not None:
            fields = {key: value for key, value in fields.items() if key in self.task_fields}
        observation, info = checked_reset(self.task.reset(seed=seed, **fields))
        self.calls_made = 0
        return self._with_tools(observation), info

    def step(self, action: str) -> tuple:
        if self.calls_made is None:
            raise RuntimeError("step() before reset()")
        calls = read_calls(self.parser, action)
        if not calls:
            step = checked_step(self.task.step(action))
            info = {**step.info, "metrics": {**step.info.get("metrics", {}), "tool_calls": 0, "tool_errors": 0}}
            return step.observation, step.reward, step.terminated, step.truncated, info
        if self.calls_made + len(calls) > self.max_tool_calls:
            observation = (
                f"Too many tool calls: {len(calls)} more would pass the limit of {self.max_tool_calls} per "
                f"episode ({self.calls_made} made). The episode ends."
            )
            return (
                observation,
                0.0,
                False,
                True,
                {"metrics": {"tool_calls": 0, "tool_errors": 0}, "tool_limit_reached": True},
            )
        self.calls_made += len(calls)
        answers = [self._answer(call) for call in calls]
        messages = [{"role": "tool", "content": self._cut(text)} for text, _ in answers]
        errors = sum(failed for _, failed in answers)
        return messages, 0.0, False, False, {"metrics": {"tool_calls": len(calls), "tool_errors": errors}}

    def close(self) -> None:
        close = getattr(self.task, "close", None)
        if close is not None:
            close()

    def _with_tools(self, observation) -> list[dict]:
        messages = [{"role": "user", "content": observation}] if isinstance(observation, str) else observation
        if messages[0]["role"] == "system":
            first, *messages = messages
            return [{**first, "content": f"{first['content']}\n\n{self.tools_prompt}"}, *messages]
        return [{"role": "system", "content": self.tools_prompt}, *messages]

    def _answer(self, call: ToolCall | ToolCallError) -> tuple[str, bool]:
        """The tool message's text, and whether it is an error."""
        if isinstance(call, ToolCallError):
            return f"Error: {call}", True
        if call.name not in self.tools:
            return f"Error: there is no tool named {call.name!r}; the tools are {', '.join(self.tools)}", True
        function = self.tools[call.name]
        try:
            inspect.signature(function).bind(**call.arguments)
        except TypeError as error:
            return f"Error: {call.name}: {error}", True
        try:
            result = function(**call.arguments)
        except Exception as error:
            return f"Error: {call.name} raised {describe(error)}", True
        return (result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)), False

    def _cut(self, text: str) -> str:
        if self.max_result_chars is None or len(text) <= self.max_result_chars:
            return text
        return f"{text[: self.max_result_chars]}... [cut: {len(text)} characters in all]"


def tool_schema(name: str, function) -> dict:
    """What the model is shown of a tool, in the OpenAI / Qwen form: its docstring, and its parameters
    as a JSON schema (a type for the annotations _JSON_TYPES knows; required: those without a default)."""
    properties, required = {}, []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        annotation = parameter.annotation
        written = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
        json_type = _JSON_TYPES.get(written.partition("[")[0].strip())
        properties[parameter.name] = {"type": json_type} if json_type else {}
        if parameter.default is inspect.Parameter.empty:
            required.append(parameter.name)
    parameters = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": name, "description": inspect.getdoc(function) or "", "parameters": parameters},
    }


def _resolve_tools(specs) -> dict:
    """name -> function, for the import paths (or functions) in `specs`."""
    if isinstance(specs, str) or not specs:
        raise ValueError(f"tools must be a non-empty list of package.module:function import paths, got {specs!r}")
    from roll_lite.runtime.importing import load_object

    tools = {}
    for spec in specs:
        function = load_object(spec) if isinstance(spec, str) else spec
        name = getattr(function, "__name__", None)
        if not callable(function) or not name:
            raise TypeError(f"tool {spec!r} is a {type(function).__name__}, not a function")
        if name in tools:
            raise ValueError(f"two tools are named '{name}'; the model calls them by name")
        positional = [
            p.name
            for p in inspect.signature(function).parameters.values()
            if p.kind is inspect.Parameter.POSITIONAL_ONLY
        ]
        if positional:
            raise TypeError(
                f"tool {spec!r} has positional-only parameters ({', '.join(positional)}); the model "
                "passes arguments by name"
            )
        tools[name] = function
    return tools


def _is_whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
