"""data.domain_weights: prompts drawn by domain weight, deterministic, resumed exactly, every row of a
domain once per that domain's epoch; bad weights stop the run before it starts."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from roll_lite.config import ConfigError, load_config
from roll_lite.data.domain_sampler import DomainSampler, training_sampler
from roll_lite.data.files import DataError
from roll_lite.data.prompts import prepare_datasets
from roll_lite.data.sampler import PromptSampler
from roll_lite.model.tokenizer import build_char_tokenizer

DOMAINS = ["math"] * 30 + ["code"] * 10 + ["chat"] * 5


def test_domains_are_drawn_by_weight_and_each_domains_rows_cycle_without_repeats():
    sampler = DomainSampler(DOMAINS, {"math": 1.0, "code": 2.0, "chat": 1.0}, seed=3)
    rows = [row for _ in range(500) for row in sampler.draw(8)]
    counts = Counter(DOMAINS[row] for row in rows)
    assert abs(counts["code"] / len(rows) - 0.5) < 0.03 and abs(counts["math"] / len(rows) - 0.25) < 0.03
    code_rows = [row for row in rows if DOMAINS[row] == "code"]
    for start in range(0, len(code_rows) - 10, 10):  # epoch after epoch, each of code's 10 rows once
        assert sorted(code_rows[start : start + 10]) == list(range(30, 40))


def test_the_draws_depend_only_on_the_seed_and_a_resume_continues_exactly():
    weights = {"math": 1.0, "code": 1.0, "chat": 0.5}
    first = DomainSampler(DOMAINS, weights, seed=11)
    for _ in range(7):
        first.draw(4)
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint keeps it
    expected = [first.draw(4) for _ in range(20)]
    resumed = DomainSampler(DOMAINS, weights, seed=11)
    resumed.load_state_dict(state)
    assert [resumed.draw(4) for _ in range(20)] == expected
    other = DomainSampler(DOMAINS, weights, seed=12)
    assert [other.draw(4) for _ in range(5)] != [DomainSampler(DOMAINS, weights, seed=11).draw(4) for _ in range(5)]
    with pytest.raises(ValueError, match="same data.domain_weights needed"):
        DomainSampler(DOMAINS, {"math": 1.0, "code": 1.0, "chat": 1.0}, seed=11).load_state_dict(state)


def test_a_weight_of_zero_leaves_a_domain_out():
    sampler = DomainSampler(DOMAINS, {"math": 1.0, "code": 0.0, "chat": 1.0})
    assert not any(DOMAINS[row] == "code" for _ in range(50) for row in sampler.draw(8))


@pytest.mark.parametrize(
    "weights, message",
    [
        ({"math": 1.0, "code": 1.0}, "the data has domain\\(s\\) 'chat' with no weight"),
        ({"math": 1.0, "code": 1.0, "chat": 1.0, "poetry": 1.0}, "no training row has domain\\(s\\) 'poetry'"),
    ],
)
def test_weights_must_name_exactly_the_datas_domains(weights, message):
    with pytest.raises(DataError, match=message):
        DomainSampler(DOMAINS, weights)


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.domain_weights={math: -1.0}", "data.domain_weights.math: must be a number >= 0"),
        ("data.domain_weights={math: 0.0}", "data.domain_weights: needs a weight > 0"),
        ("data.epochs=2", "data.epochs: must be null with data.domain_weights"),
    ],
)
def test_bad_weights_are_config_errors(override, message):
    overrides = ["data.domain_weights={math: 1.0}", override] if "epochs" in override else [override]
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_the_pipeline_samples_by_the_rows_domain_field(tmp_path):
    path = tmp_path / "mixed.jsonl"
    rows = [{"prompt": f"{i}=", "answer": str(i), "domain": "a" if i < 6 else "b"} for i in range(8)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = load_config(None, [f"data.train_files={path}", "data.domain_weights={a: 1.0, b: 3.0}"])
    prepared = prepare_datasets(config.data, build_char_tokenizer(), domains=list(config.data.domain_weights))
    sampler = training_sampler(config.data, prepared.train, seed=0)
    assert isinstance(sampler, DomainSampler)
    drawn = Counter("b" if row >= 6 else "a" for _ in range(200) for row in sampler.draw(4))
    assert 0.70 < drawn["b"] / 800 < 0.80
    plain = load_config(None, [f"data.train_files={path}"])
    assert isinstance(training_sampler(plain.data, prepared.train, seed=0), PromptSampler)
    with pytest.raises(DataError, match="key 'domain': domain 'b' is not a configured domain"):
        prepare_datasets(config.data, build_char_tokenizer(), domains=["a"])
