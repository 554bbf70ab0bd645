"""The mixed-domain run (configs/mixed_domains.yaml, docs/rewards.md): its data (roll_lite/data/
digit_domains.py) is what the repository ships, each task's answers are right, held-out prompts stay
held out, the judge learns from the template the config gives it; and the docs' three commands run
end to end with tiny models, each domain's rows scored by its own source."""

import json
import random
import re
import shlex
import sys
from pathlib import Path

import doc_commands
import jinja2
from warm_driver import roll_train

from roll_lite.config import load_config
from roll_lite.data.digit_domains import JUDGE_TEMPLATE, TASKS, VERDICTS, judge_rows, write_digit_domains

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data/digit_domains"
TINY = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_hidden_layers=1",
    "model.num_attention_heads=2",
    "model.num_key_value_heads=1",
    "workers.torch_threads=1",
]


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines()]


def test_the_shipped_files_are_the_generators_output(tmp_path):
    for path in write_digit_domains(tmp_path):
        assert path.read_bytes() == (DATA / path.name).read_bytes(), path.name


def test_each_domain_has_right_answers_held_out_prompts_and_a_noisy_demonstrator():
    train, evaluation = rows("train.jsonl"), rows("eval.jsonl")
    assert TASKS["increment"][1]("3909") == "4010" and TASKS["decrement"][1]("3090") == "2989"
    for domain, (operator, solve) in TASKS.items():
        mine = [r for r in train if r["domain"] == domain]
        held_out = {r["prompt"] for r in evaluation if r["domain"] == domain}
        assert len(mine) == 4000 and len(held_out) == 32 and not held_out & {r["prompt"] for r in mine}
        assert all(r["prompt"].endswith(operator) and r["answer"] == solve(r["prompt"][:-1]) for r in mine)
        assert all(r["demonstration"] in (r["answer"], r["prompt"][:-1]) for r in mine)
        assert 0.25 < sum(r["demonstration"] == r["answer"] for r in mine) / len(mine) < 0.36


def test_the_reward_models_pairs_and_the_judges_rows_are_right_and_wrong_answers():
    increment = {
        r["prompt"]: r["answer"] for r in rows("train.jsonl") + rows("eval.jsonl") if r["domain"] == "increment"
    }
    for name in ("increment_pairs_train.jsonl", "increment_pairs_eval.jsonl"):
        pairs = rows(name)
        assert all(p["chosen"] == increment[p["prompt"]] != p["rejected"] for p in pairs), name
    held_out_answers = {r["answer"] for r in rows("eval.jsonl") if r["domain"] == "decrement"}
    judged = rows("judge_eval.jsonl")
    assert all(row["answer"] in held_out_answers for row in judged)
    template = jinja2.Template(JUDGE_TEMPLATE)
    for row in rows("judge_train.jsonl") + judged:  # right iff the response is the answer, read through the template
        assert row["response"] == VERDICTS[row["judged"] == row["answer"]]
        assert row["prompt"] == template.render(response=row["judged"], answer=row["answer"])
    verdicts = [row["response"] for row in rows("judge_train.jsonl")]
    assert 0.45 < verdicts.count(VERDICTS[True]) / len(verdicts) < 0.55
    # the template pairs the answer's and the response's digits, marking a missing one
    assert [template.render(response=r, answer="012") for r in ("012", "013", "01", "0123")] == [
        "00,11,22,?",
        "00,11,23,?",
        "00,11,2_,?",
        "00,11,22,3?",
    ]
    (row,) = judge_rows([{"prompt": "123-", "answer": "012"}], random.Random(1))
    assert row["prompt"] == template.render(response=row["judged"], answer="012")


def test_the_judges_parser_takes_yes_or_no_and_nothing_else():
    from roll_lite.data.digit_domains import parse_verdict

    assert [parse_verdict(reply) for reply in ("yes", " no\n", "Yes", "yes no", "", "maybe")] == [
        1.0,
        0.0,
        1.0,
        None,
        None,
        None,
    ]


def test_the_configs_judge_template_is_the_one_the_judge_learnt(tmp_path, monkeypatch):
    from test_judge import save_judge
    from test_reward_model import save_reward_model

    monkeypatch.chdir(tmp_path)  # where the config's first two commands leave the model and the judge
    save_reward_model(tmp_path / "outputs/rm_increment/final"), save_judge(tmp_path / "outputs/judge_decrement/final")
    assert load_config(REPO / "configs/mixed_domains.yaml", []).reward.judge_template == JUDGE_TEMPLATE


def test_the_docs_three_commands_train_both_sources_and_route_every_domain(tmp_path):
    for name in ("configs", "data"):
        (tmp_path / name).symlink_to(REPO / name)
    (reward_model,) = doc_commands.commands("roll-train", "run_name=rm_increment")
    (judge,) = doc_commands.commands("roll-train", "run_name=judge_decrement")
    (grpo,) = doc_commands.commands("roll-train", "configs/mixed_domains.yaml")
    # small, and in one process (workers.backend=local: no Ray, bit for bit the same runs)
    small = [*TINY, "workers.backend=local"]
    roll_train(shlex.split(reward_model) + small + ["preference.steps=2", "preference.eval_every=2"], tmp_path)
    roll_train(shlex.split(judge) + small + ["sft.steps=2", "sft.eval_every=2"], tmp_path)
    result = roll_train(shlex.split(grpo) + small + ["steps=2", "eval_every=2", "sft.steps=2"], tmp_path)
    assert "reverse: exact_answer; increment: model:rm_increment; decrement: judge:judge_decrement" in result.stderr
    records = [
        json.loads(line) for line in (tmp_path / "outputs/grpo_mixed_domains/metrics.jsonl").read_text().splitlines()
    ]
    steps = [r for r in records if "reward/mean" in r]
    assert len(steps) == 2
    # every domain's rows went to its own source: the model scored, the untrained judge's replies have no verdict
    assert any(r["reward/increment/model:rm_increment/failed"] == 0 for r in steps if "reward/increment/mean" in r)
    judged = [r for r in steps if "reward/decrement/mean" in r]
    assert judged and all(r["reward/decrement/judge:judge_decrement/unparseable"] > 0 for r in judged)
    assert not any(
        key.startswith("reward/reverse/model") or key.startswith("reward/reverse/judge") for r in steps for key in r
    )
    # the log shows each domain's reward apart, never one mean over a logit, a yes-rate and an exact-answer rate
    log = result.stderr
    held_out = ", ".join(f"{d} {steps[-1][f'eval/reward/{d}/mean']:.3f}" for d in ("decrement", "increment", "reverse"))
    assert re.search(r"step 0 \(before RL\): held-out decrement -?[0-9.]+, increment -?[0-9.]+, reverse", log), log
    assert f"| held-out {held_out} |" in log, log
    first_words = re.findall(r" step [12]/2 \| reward (\S+) ", log)  # a domain's name, never a number
    assert len(first_words) == 2 and set(first_words) <= {"decrement", "increment", "reverse"}, first_words
    assert re.search(
        r"held-out reward: decrement -?[0-9.]+ -> -?[0-9.]+, increment .*, reverse .*\(start -> end\)", log
    ), log


def test_the_examples_stages_are_the_configs_header_commands(monkeypatch):
    sys.path.insert(0, str(REPO / "examples/rewards"))
    import mixed_domains

    monkeypatch.chdir(REPO)
    stages = mixed_domains.stages()
    assert list(stages) == ["reward_model", "judge", "grpo"]
    assert stages["grpo"] == ["--config", "configs/mixed_domains.yaml"]
    assert [mixed_domains.run_name(a) for a in stages.values()] == [
        "rm_increment",
        "judge_decrement",
        "grpo_mixed_domains",
    ]
    for name, arguments in stages.items():  # the docs show the same commands
        assert doc_commands.commands("roll-train", " ".join(arguments)) == ["roll-train " + " ".join(arguments)], name
