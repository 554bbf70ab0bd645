"""LLM judges (roll_lite/rewards/judge.py): a template per row, greedy replies from our hf engine, and a
strict parser: the last well-formed verdict, or `unparseable` with the reply's start, never a guess."""

import os
import time

import pytest
import torch
from roll_lite.workers.reward_worker import RewardWorker
from transformers import AutoConfig, AutoModelForCausalLM

from roll_lite.config import RewardConfig
from roll_lite.model.tokenizer import build_char_tokenizer
from roll_lite.rewards.judge import Judge, check_judge_folder, parse_correctness, parse_pointwise, template_source
from roll_lite.rollout.engine import Completions


def save_judge(folder, hidden_size=32, num_attention_heads=4, max_position_embeddings=1024):
    """A tiny generative judge; tests/vllm_judge_check.py asks for a head size vLLM's CPU attention has kernels for."""
    tokenizer = build_char_tokenizer()
    config = AutoConfig.for_model(
        "qwen2",
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_attention_heads // 2,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_the_parsers_take_the_last_well_formed_verdict_and_nothing_else():
    assert parse_pointwise("Good.\nScore: 3\nOn second thought:\nScore: 8") == 0.8
    assert parse_pointwise("Score: 10") == 1.0 and parse_pointwise("Score: 0") == 0.0
    for reply in ("Score: 11", "score 7", "I'd give it a 7", "Score: 7.5", "Score: -1", "yes"):
        assert parse_pointwise(reply) is None, reply
    assert parse_correctness("Verdict: incorrect\nVerdict: Correct") == 1.0
    assert parse_correctness("Verdict: incorrect") == 0.0
    for reply in ("yes, this is correct", "correct", "Verdict: maybe"):  # a "yes" somewhere is not a verdict
        assert parse_correctness(reply) is None, reply


def test_templates_name_only_fields_a_row_has():
    assert "{{ answer }}" in template_source("correctness")
    assert template_source("Grade {{ response }} for {{ extra.topic }}").startswith("Grade")
    with pytest.raises(ValueError, match="reward.judge_template: names reference, which a row does not have"):
        template_source("{{ response }} vs {{ reference }}")
    with pytest.raises(ValueError, match="'strict' is not one of pointwise, correctness"):
        template_source("strict")


def test_a_bad_judge_folder_is_named_with_its_key(tmp_path):
    from test_reward_model import save_reward_model

    with pytest.raises(ValueError, match="reward.judges.x: no such folder"):
        check_judge_folder(str(tmp_path / "missing"), "reward.judges.x")
    classifier = save_reward_model(tmp_path / "rm")
    with pytest.raises(ValueError, match="is a Qwen2ForSequenceClassification model, not a generative one"):
        check_judge_folder(classifier, "reward.judges.rm")


PARTS = [{"type": "image"}, {"type": "text", "text": "how many? "}, {"type": "image"}]  # an image row's content


def test_replies_become_scores_or_named_outcomes(tmp_path, monkeypatch):
    judge = Judge(save_judge(tmp_path / "judge"), template="correctness", max_new_tokens=8)
    seen = []

    def replies(texts):
        def generate(prompts, params, max_time_s=None):
            seen.extend(judge.tokenizer.decode(ids) for ids in prompts)
            assert params.greedy and params.max_new_tokens == 8
            return Completions([judge.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts])

        return generate

    monkeypatch.setattr(
        judge.engine,
        "generate",
        replies(
            ["Verdict: correct", "Verdict: incorrect", "", "it is correct", "Verdict: correct", "Verdict: correct"]
        ),
    )
    outcomes = judge.score(
        ["1+1=", "2+2=", "3+3=", "4+4=", [{"role": "user", "content": "5+5="}], [{"role": "user", "content": PARTS}]],
        ["2", "5", "6", "8", "10", "3"],
        ["2", "4", "6", "8", "10", "3"],
        [{}] * 6,
    )
    assert [(o.kind, o.value) for o in outcomes] == [
        ("ok", 1.0),
        ("ok", 0.0),
        ("unparseable", 0.0),
        ("unparseable", 0.0),
        ("ok", 1.0),
        ("ok", 1.0),
    ]
    assert outcomes[2].reason == "the judge's reply is empty"
    assert outcomes[3].reason == "no verdict in the judge's reply 'it is correct'"
    assert "Reference answer: 4\nResponse: 5" in seen[1] and "user: 5+5=" in seen[4]  # the template, row by row
    assert "Prompt: user: <image>how many? <image>\n" in seen[5]  # an image row's parts, read as text

    def broken(prompts, params, max_time_s=None):
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(judge.engine, "generate", broken)
    assert {(o.kind, o.reason) for o in judge.score(["p"], ["r"], ["a"], [{}])} == {
        ("failed", f"judge {judge.path}: RuntimeError: CUDA error: out of memory")
    }


def test_a_real_untrained_judge_is_unparseable_not_guessed_and_the_worker_counts_it(tmp_path):
    folder = save_judge(tmp_path / "tiny_judge")
    worker = RewardWorker(
        RewardConfig(
            functions={"exact_answer": 1.0}, judges={folder: 2.0}, judge_template="pointwise", judge_max_new_tokens=6
        )
    )
    assert worker.describe() == [
        f"judge {folder}: greedy, at most 6 new tokens, hf engine",
        "reward models and judges on cpu",
    ]
    scores, scored, metrics = worker.score(["7", "8"], ["7", "7"], None, ["3+4=", "3+4="], [[1], [1]])
    assert scored.tolist() == [False, False] and scores.tolist() == [1.0, 0.0]  # only exact_answer scored
    assert metrics["reward/judge:tiny_judge/unparseable"] == 2.0 and metrics["reward/unscored"] == 2.0
    again = worker.score(["7", "8"], ["7", "7"], None, ["3+4=", "3+4="], [[1], [1]])
    assert torch.equal(again[0], scores)  # greedy: the same inputs, the same outcome


def test_a_judge_past_its_timeout_gives_timed_out_rows_not_a_frozen_step(tmp_path):
    """reward.judge_timeout_s stops the judge's generation: the rows it cut are timed_out, named; without
    it the same untrained judge runs every reply to max_new_tokens (no verdict: unparseable)."""
    folder = save_judge(tmp_path / "judge")
    rows = (["1+1="] * 4, ["2"] * 4, ["2"] * 4, [{}] * 4)
    slow = Judge(folder, template="correctness", max_new_tokens=64, timeout_s=1e-6)
    outcomes = slow.score(*rows)
    assert [o.kind for o in outcomes] == ["timed_out"] * 4, outcomes
    assert "cut at reward.judge_timeout_s=1e-06 s after" in outcomes[0].reason
    assert slow.describe().endswith("at most 64 new tokens, at most 1e-06 s a call, hf engine")
    unlimited = Judge(folder, template="correctness", max_new_tokens=16)
    assert [o.kind for o in unlimited.score(*rows)] == ["unparseable"] * 4


USER_PARSER = """
import os, time

def parse(reply):
    if reply == "hang":
        while True:
            time.sleep(1)
    if reply == "raise":
        raise ValueError("cannot read " + reply)
    if reply == "text":
        return "1.0"
    if reply == "crash":
        os._exit(3)
    return {"yes": 1.0, "no": 0.0}.get(reply)
"""
# rendered in the judge's guarded process: a row whose response is "hang" never ends, one without extra.topic raises
USER_TEMPLATE = "{% if response == 'hang' %}{% for i in range(10 ** 12) %}{% endfor %}{% endif %}{{ response }} on {{ extra.topic }}"


@pytest.fixture
def user_parser(tmp_path, monkeypatch):
    (tmp_path / "judge_parser_for_test.py").write_text(USER_PARSER)
    monkeypatch.syspath_prepend(str(tmp_path))  # the guarded process gets this process's sys.path
    yield "judge_parser_for_test:parse"


def fixed_replies(judge, texts, seen=None):
    """judge.engine.generate's stand-in: `texts` as the replies, the prompts it got appended to `seen`."""

    def generate(prompts, params, max_time_s=None):
        if seen is not None:
            seen.extend(judge.tokenizer.decode(ids, skip_special_tokens=True) for ids in prompts)
        return Completions([judge.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts[: len(prompts)]])

    return generate


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_parser_of_your_own_that_hangs_raises_or_returns_garbage_costs_its_row_not_the_step(
    tmp_path, monkeypatch, user_parser
):
    """reward.judge_parser runs in a guarded process, a batch's rows at once: 11 rows that never return cost
    one reward.timeout_s (not 11), and the process that held them is killed, so nothing of them is left."""
    judge = Judge(save_judge(tmp_path / "judge"), "correctness", user_parser, max_new_tokens=8, user_code_timeout_s=1.0)
    try:
        replies = ["yes", "hang", "raise", "text", "no", "maybe", "", *["hang"] * 10]
        monkeypatch.setattr(judge.engine, "generate", fixed_replies(judge, replies))
        assert judge.code is not None and judge.describe().endswith(
            "your parser in a guarded process, at most 1 s a batch"
        )
        first = judge.code.process.pid
        start = time.monotonic()
        outcomes = judge.score(["p"] * 17, ["r"] * 17, ["a"] * 17, [{}] * 17)
        elapsed = time.monotonic() - start
        assert [(o.kind, o.value) for o in outcomes] == [
            ("ok", 1.0),
            ("timed_out", 0.0),
            ("failed", 0.0),
            ("failed", 0.0),
            ("ok", 0.0),
            ("unparseable", 0.0),
            ("unparseable", 0.0),
            *[("timed_out", 0.0)] * 10,
        ]
        assert [o.reason for o in outcomes[1:4]] == [
            "judge parser: no result within reward.timeout_s=1 s",
            "judge parser: ValueError: cannot read raise",
            "judge parser: TypeError: returned a str, not a number",
        ]
        # one after another, the hangs alone would take 11 s; the margin is for restarting on a busy machine
        assert 1.0 <= elapsed < 8.0, elapsed
        assert judge.code.starts == 2 and gone(first)  # the hanging calls died with their process

        monkeypatch.setattr(judge.engine, "generate", fixed_replies(judge, ["crash"]))
        (crashed,) = judge.score(["p"], ["r"], ["a"], [{}])
        assert (crashed.kind, crashed.reason) == ("failed", "judge parser: its process died with exit code 3")
        monkeypatch.setattr(judge.engine, "generate", fixed_replies(judge, ["no", "yes"]))
        assert [o.value for o in judge.score(["p"] * 2, ["r"] * 2, ["a"] * 2, [{}] * 2)] == [0.0, 1.0]  # restarted
        last = judge.code.process.pid
    finally:
        judge.close()
    assert gone(last)


def test_a_template_of_your_own_that_hangs_or_raises_costs_its_row_and_is_not_generated(tmp_path, monkeypatch):
    judge = Judge(save_judge(tmp_path / "judge"), USER_TEMPLATE, max_new_tokens=8, user_code_timeout_s=0.5)
    try:
        seen: list[str] = []
        monkeypatch.setattr(judge.engine, "generate", fixed_replies(judge, ["Score: 7"] * 2, seen))
        outcomes = judge.score(["p"] * 4, ["hang", "fine", "hang", "good"], ["a"] * 4, [{"topic": "x"}] * 3 + [{}])
        assert [o.kind for o in outcomes] == ["timed_out", "ok", "timed_out", "failed"]
        assert outcomes[0].reason == "judge template: no result within reward.timeout_s=0.5 s"
        assert outcomes[3].reason == "judge template: UndefinedError: 'dict object' has no attribute 'topic'"
        assert outcomes[1].value == 0.7 and seen == ["fine on x"]  # the built-in pointwise parser, here
    finally:
        judge.close()


def test_the_worker_bounds_a_hanging_parser_by_reward_timeout_s_and_counts_it(tmp_path, monkeypatch, user_parser):
    folder = save_judge(tmp_path / "judge")
    worker = RewardWorker(
        RewardConfig(
            functions={"exact_answer": 1.0},
            judges={folder: 1.0},
            judge_template="correctness",
            judge_parser=user_parser,
            timeout_s=0.5,
        )
    )
    try:
        judge = worker.judges[folder]
        monkeypatch.setattr(judge.engine, "generate", fixed_replies(judge, ["hang", "hang", "yes"]))
        scores, scored, metrics = worker.score(["7", "8", "7"], ["7"] * 3, None, ["3+4="] * 3, [[1]] * 3)
        assert scored.tolist() == [False, False, True] and scores.tolist() == [1.0, 0.0, 2.0]
        assert metrics["reward/judge:judge/timed_out"] == 2.0 and metrics["reward/unscored"] == 2.0
        child = judge.code.process.pid
    finally:
        worker.close()
    assert gone(child)
