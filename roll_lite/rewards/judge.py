"""An LLM judge: a generative model from a local folder that reads each (prompt, response) through a
template and answers with a verdict, which a strict parser turns into a score.

Templates (`reward.judge_template`): `pointwise` (a 0–10 score against a rubric; the score is N / 10)
and `correctness` (correct / incorrect against the row's reference answer: 1 or 0), or Jinja of your
own with the fields `prompt`, `response`, `answer` and `extra` (the row's other fields). The rendered
text is the judge's user message, through the judge's own chat template when it has one.

The parser takes the last well-formed verdict of the reply: `Score: N` (N an integer 0–10) or
`Verdict: correct|incorrect`; with a template of your own, `reward.judge_parser` (an import path of
fn(reply) -> float | None) or the pointwise parser. A reply without one is `unparseable`, with the
reply's start as the reason: never a guess (a reply that says "yes" somewhere is not a verdict).
A parser and a template of your own run in a guarded child process, each row's call bounded by
reward.timeout_s (judge_code.py); ours run here.
The judge decodes greedily with our hf engine, or with reward.judge_engine=vllm a vLLM engine in the
reward worker (roll_lite/rollout/vllm_engine.py serve_model), so the same inputs give the same scores.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

from roll_lite.data.chat import text_messages
from roll_lite.rewards.calls import describe
from roll_lite.rewards.judge_code import JudgeCode, Row, compile_template, render, verdict
from roll_lite.rewards.outcomes import Score, failed, timed_out

TEMPLATES = {
    "pointwise": (
        "Rate the response to the prompt from 0 (useless or wrong) to 10 (correct, complete and clear).\n"
        "Prompt: {{ prompt }}\nResponse: {{ response }}\n"
        "End your reply with one line 'Score: N', N an integer from 0 to 10."
    ),
    "correctness": (
        "Is the response's final answer the same as the reference answer?\n"
        "Prompt: {{ prompt }}\nReference answer: {{ answer }}\nResponse: {{ response }}\n"
        "End your reply with one line 'Verdict: correct' or 'Verdict: incorrect'."
    ),
}
FIELDS = {"prompt", "response", "answer", "extra"}
SCORE = re.compile(r"Score:\s*(\d+)\s*$", re.MULTILINE)
VERDICT = re.compile(r"Verdict:\s*(correct|incorrect)\s*$", re.MULTILINE | re.IGNORECASE)


def parse_pointwise(reply: str) -> float | None:
    """N / 10 for the last line 'Score: N' with N in 0..10; None without one."""
    matches = [int(m) for m in SCORE.findall(reply)]
    return matches[-1] / 10 if matches and 0 <= matches[-1] <= 10 else None


def parse_correctness(reply: str) -> float | None:
    """1 for a last line 'Verdict: correct', 0 for 'Verdict: incorrect'; None without one."""
    matches = VERDICT.findall(reply)
    return None if not matches else float(matches[-1].lower() == "correct")


PARSERS = {"pointwise": parse_pointwise, "correctness": parse_correctness}


def template_source(template: str) -> str:
    """A built-in template's Jinja, or `template` itself (Jinja of your own); its syntax and fields
    checked (a ValueError naming the key, and the template's line for a syntax error)."""
    import jinja2
    from jinja2 import meta

    source = TEMPLATES.get(template, template)
    if template not in TEMPLATES and "{{" not in template:
        raise ValueError(
            f"reward.judge_template: '{template}' is not one of {', '.join(TEMPLATES)}, nor Jinja with "
            f"the fields {', '.join(sorted(FIELDS))}"
        )
    try:
        parsed = jinja2.Environment().parse(source)
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(
            f"reward.judge_template: Jinja syntax error on line {error.lineno} of the template: {error.message}"
        ) from None
    unknown = meta.find_undeclared_variables(parsed) - FIELDS
    if unknown:
        raise ValueError(
            f"reward.judge_template: names {', '.join(sorted(unknown))}, which a row does not have "
            f"(fields: {', '.join(sorted(FIELDS))})"
        )
    return source


def judge_metric_name(path: str) -> str:
    """reward/<this>: the judge's folder_label (its folder's name, or its run's for a final/)."""
    from roll_lite.rewards.reward_model import folder_label

    return f"judge:{folder_label(path)}"


def check_judge_folder(path: str, key: str) -> None:
    """Before the run: a local folder holding a generative model and a tokenizer."""
    from roll_lite.model.files import local_model

    _, tokenizer = local_model(path, key, "a judge", "AutoModelForCausalLM", "a generative one")
    if tokenizer.eos_token_id is None:
        raise ValueError(
            f"{key}: the tokenizer of '{path}' has no eos token, so a reply would never end before "
            "reward.judge_max_new_tokens (set one and save it again)"
        )


class Judge:
    def __init__(
        self,
        path: str,
        template: str = "pointwise",
        parser: str | None = None,
        max_new_tokens: int = 32,
        seed: int = 0,
        timeout_s: float | None = None,
        device: str = "cpu",
        engine: str = "hf",
        gpu_memory_utilization: float = 0.2,
        user_code_timeout_s: float = 5.0,
    ):
        """`parser`: an import path (reward.judge_parser); `engine`: hf (transformers' generate) or vllm (a
        vLLM engine in this process, on `device`'s GPU or vLLM's CPU build; `gpu_memory_utilization` its
        share of the GPU); `timeout_s` (reward.judge_timeout_s) bounds the generation and needs hf;
        `user_code_timeout_s` (reward.timeout_s) each row's call of a parser or template of your own."""
        if engine == "vllm" and timeout_s is not None:
            raise ValueError(
                "reward.judge_timeout_s: a vLLM judge's generation has no time limit; set it to null "
                "or use reward.judge_engine=hf"
            )
        self.path, self.max_new_tokens, self.timeout_s, self.engine_name = path, max_new_tokens, timeout_s, engine
        source = template_source(template)
        own_template = template not in TEMPLATES
        self.template = None if own_template else compile_template(source)  # None: rendered in self.code
        self.parse = None if parser else PARSERS.get(template, parse_pointwise)  # None: called in self.code
        # started first, so that the child's imports (the parser's module) overlap loading the model here
        self.code = (
            JudgeCode(parser, source if own_template else None, user_code_timeout_s) if parser or own_template else None
        )
        try:
            self._load(Path(path).expanduser(), seed, device, gpu_memory_utilization)
            if self.code is not None:
                self.code.wait_ready()
        except BaseException:
            self.close()
            raise

    def _load(self, folder: Path, seed: int, device: str, gpu_memory_utilization: float) -> None:
        """The tokenizer and the engine that generates the replies."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        self.engine: Any
        if self.engine_name == "vllm":
            from roll_lite.rollout.vllm_engine import serve_model

            self.engine = serve_model(
                model, self.tokenizer.eos_token_id, seed, device.startswith("cuda"), gpu_memory_utilization
            )
        else:
            from roll_lite.rollout.hf import HFEngine

            self.engine = HFEngine(model.to(device), pad, self.tokenizer.eos_token_id, seed=seed)

    def describe(self) -> str:
        limit = f", at most {self.timeout_s:g} s a call" if self.timeout_s is not None else ""
        guarded = ""
        if self.code is not None:
            yours = [name for name, ours in (("template", self.template), ("parser", self.parse)) if ours is None]
            guarded = f"; your {' and '.join(yours)} in a guarded process, at most {self.code.timeout_s:g} s a batch"
        return (
            f"judge {self.path}: greedy, at most {self.max_new_tokens} new tokens{limit}, "
            f"{self.engine_name} engine{guarded}"
        )

    def _generate(self, inputs: list[list[int]]) -> list[list[int]]:
        from roll_lite.rollout.engine import SamplingParams

        params = SamplingParams(self.max_new_tokens, greedy=True)
        if self.engine_name == "vllm":
            return self.engine.generate(inputs, params).token_ids
        return self.engine.generate(inputs, params, self.timeout_s).token_ids

    def score(self, prompts: list[Any], responses: list[str], answers: list[str], extras: list[dict]) -> list[Score]:
        rows = [(_as_text(p), r, a, e) for p, r, a, e in zip(prompts, responses, answers, extras)]
        texts = self._rendered(rows)
        results: list[Score | None] = [text if isinstance(text, Score) else None for text in texts]
        judged = [i for i, text in enumerate(texts) if isinstance(text, str)]
        try:
            replies = self._generate([self._input_ids(cast(str, texts[i])) for i in judged]) if judged else []
        except Exception as error:  # the judge's rows fail; the other sources and the run go on
            reason = failed(f"judge {self.path}: {describe(error)}")
            return [reason if result is None else result for result in results]
        for i, reply in zip(judged, replies):
            results[i] = self._cut(reply)
        uncut = {
            i: self.tokenizer.decode(reply, skip_special_tokens=True)
            for i, reply in zip(judged, replies)
            if results[i] is None
        }
        for i, outcome in zip(uncut, self._verdicts(list(uncut.values()))):
            results[i] = outcome
        return cast("list[Score]", results)  # cast: each row has its outcome by now

    def _rendered(self, rows: list[Row]) -> list[str | Score]:
        if self.template is not None:
            return [render(self.template, row) for row in rows]
        assert self.code is not None  # a template of your own: rendered in the guarded process
        return self.code.render(rows)

    def _verdicts(self, replies: list[str]) -> list[Score]:
        if self.parse is not None:
            return [verdict(self.parse, reply) for reply in replies]
        assert self.code is not None  # a parser of your own: called in the guarded process
        return self.code.parse(replies)

    def close(self) -> None:
        """Stops the guarded process of a parser or template of your own."""
        if self.code is not None:
            self.code.close()

    def _cut(self, reply: list[int]) -> Score | None:
        """`timed_out` for a reply that reward.judge_timeout_s stopped: no EOS, and shorter than the
        judge's max_new_tokens (so it was not the length that ended it)."""
        if (
            self.timeout_s is None
            or len(reply) >= self.max_new_tokens
            or (reply and reply[-1] == self.engine.eos_token_id)
        ):
            return None
        return timed_out(
            f"judge {self.path}: the reply was cut at reward.judge_timeout_s={self.timeout_s:g} s "
            f"after {len(reply)} tokens"
        )

    def _input_ids(self, text: str) -> list[int]:
        if self.tokenizer.chat_template:
            return list(
                self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True, return_dict=False
                )
            )
        return self.tokenizer(text)["input_ids"]


def _as_text(prompt: Any) -> str:
    """A prompt as the template's `prompt` field: chat messages become the conversation's text, an image part
    `<image>` (roll_lite/data/chat.py content_text: the judge reads text only)."""
    if isinstance(prompt, list):
        return "\n".join(f"{m['role']}: {m['content']}" for m in text_messages(prompt))
    return prompt
