"""reward.domains: each row goes to its domain's sources only, in the batch's order, with metrics per
domain; a row whose domain the config does not map stops the run before it starts, naming the
domain, the file and the row; never a silent fallback to another domain's sources."""

import json

import pytest
from roll_lite.workers.reward_worker import RewardWorker

from roll_lite.config import ConfigError, RewardConfig, load_config
from roll_lite.config.reward import DomainRewardConfig
from roll_lite.data.files import DataError
from roll_lite.data.prompts import prepare_datasets
from roll_lite.model.tokenizer import build_char_tokenizer


def routed(**domains) -> RewardConfig:
    return RewardConfig(domains={name: DomainRewardConfig(functions=functions) for name, functions in domains.items()})


def test_each_row_is_scored_by_its_domains_sources_only_in_the_batchs_order():
    worker = RewardWorker(routed(exact={"exact_answer": 1.0}, digits={"digits_only": 2.0}))
    responses, answers = ["12", "12", "ab", "ab", "7"], ["12", "99", "ab", "zz", "7"]
    extras = [{"domain": d} for d in ("exact", "digits", "exact", "digits", "exact")]
    scores, scored, metrics = worker.score(responses, answers, extras)
    # exact_answer: 1 if equal; digits_only (weight 2): 1 if the response is all digits, whatever the answer
    assert scores.tolist() == [1.0, 2.0, 1.0, 0.0, 1.0] and scored.all()
    assert metrics["reward/exact/exact_answer"] == 1.0 and metrics["reward/digits/digits_only"] == 0.5
    assert metrics["reward/exact/mean"] == 1.0 and metrics["reward/digits/mean"] == 1.0
    assert "reward/exact_answer" not in metrics and "reward/digits/exact_answer" not in metrics
    assert worker.describe() == ["rewards routed by data.domain: exact: exact_answer; digits: digits_only"]
    with pytest.raises(ValueError, match="row 0 has domain='chat', not one of reward.domains"):
        worker.score(["1"], ["1"], [{"domain": "chat"}])


def test_a_domain_the_config_does_not_map_stops_the_run_naming_file_and_row(tmp_path):
    path = tmp_path / "mixed.jsonl"
    rows = [{"prompt": "1=", "answer": "1", "domain": "math"}, {"prompt": "2=", "answer": "2", "domain": "poetry"}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    data = load_config(None, [f"data.train_files={path}"]).data
    with pytest.raises(
        DataError,
        match=r"mixed.jsonl.*row 1.*key 'domain': domain 'poetry' is not a configured domain \(math: reward.domains",
    ):
        prepare_datasets(data, build_char_tokenizer(), domains=["math"])
    prepared = prepare_datasets(data, build_char_tokenizer(), domains=["math", "poetry"])
    assert [extra["domain"] for extra in prepared.train.extras] == ["math", "poetry"]
    path.write_text(json.dumps({"prompt": "1=", "answer": "1"}) + "\n")
    with pytest.raises(DataError, match="key 'domain' .*reward.domains routes each row by it"):
        prepare_datasets(data, build_char_tokenizer(), domains=["math"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("reward.domains={math: {functions: {nope: 1.0}}}", "reward.domains.math.functions.nope: 'nope' is not one of"),
        ("reward.domains={math: {}}", "reward.domains.math.functions: name at least one reward function"),
        (
            "reward.domains={math: {models: {/nonexistent/rm: 1.0}}}",
            "reward.domains.math.models./nonexistent/rm: no such folder",
        ),
    ],
)
def test_every_domains_sources_are_checked_before_the_run(override, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        load_config(None, [override])


def test_sources_outside_the_domains_are_refused_once_domains_are_set(tmp_path):
    from test_reward_model import save_reward_model

    folder = save_reward_model(tmp_path / "rm")
    with pytest.raises(ConfigError, match=r"reward.models: with reward.domains every source belongs to a domain"):
        load_config(
            None, [f"reward.models={{{folder}: 1.0}}", "reward.domains={math: {functions: {exact_answer: 1.0}}}"]
        )
    config = load_config(
        None, [f"reward.domains={{math: {{functions: {{exact_answer: 1.0}}}}, chat: {{models: {{{folder}: 1.0}}}}}}"]
    )
    assert config.reward.in_driver is False  # a reward model in some domain: a reward worker


def test_the_sources_score_concurrently_one_thread_per_scorer(tmp_path, monkeypatch):
    import threading
    import time

    from test_judge import save_judge
    from test_reward_model import save_reward_model

    from roll_lite.rewards.outcomes import scored as ok

    model, judge = save_reward_model(tmp_path / "rm"), save_judge(tmp_path / "judge")
    config = RewardConfig(
        domains={
            "a": DomainRewardConfig(functions={"exact_answer": 1.0}, models={model: 0.5}, judges={judge: 2.0}),
            "b": DomainRewardConfig(functions={"digits_only": 1.0}, judges={judge: 1.0}),
        }
    )
    worker = RewardWorker(config)
    threads = {}

    def slow(kind, value):
        def score(*columns):
            threads.setdefault(kind, set()).add(threading.current_thread().name)
            time.sleep(0.4)
            return [ok(value + i) for i in range(len(columns[1]))]  # value + the row's place in its domain

        return score

    monkeypatch.setattr(worker.models[model], "score", slow("model", 10.0))
    monkeypatch.setattr(worker.judges[judge], "score", slow("judge", 100.0))
    responses, answers = ["1", "x", "2", "3"], ["1", "x", "9", "3"]
    extras = [{"domain": d} for d in ("a", "b", "a", "b")]
    tokens = [[1, 5]] * 4
    start = time.monotonic()
    scores, scored, metrics = worker.score(responses, answers, extras, ["p"] * 4, tokens)
    elapsed = time.monotonic() - start
    # a: exact + 0.5·model + 2·judge; b: digits_only + judge. The judge's two calls (a, then b) run in one
    # thread, beside the model's: 0.8 s, not the 1.2 s of one after another.
    assert scores.tolist() == [1 + 0.5 * 10 + 2 * 100, 0 + 100, 0 + 0.5 * 11 + 2 * 101, 1 + 101] and scored.all()
    assert elapsed < 1.1, elapsed
    assert len(threads["judge"]) == 1 and threads["judge"] != threads["model"]
    assert metrics["reward/a/judge:judge"] == 100.5 and metrics["reward/b/judge:judge"] == 100.5
