"""DAPO's pieces (pipelines/dapo.py): overlong shaping and filtering by hand-worked values, dynamic
sampling's rounds, cap and group ids, and configs/dapo.yaml end to end (tiny)."""

from __future__ import annotations

import logging

import pytest
import torch
from roll_lite.pipelines.dapo import (
    filter_overlong,
    informative_rows,
    keep_informative_groups,
    overlong_penalty,
    truncated_responses,
)
from test_resume import LOCAL, REPO, TINY, data, metrics, run  # noqa: F401 (data: a fixture)

from roll_lite.config import ConfigError, load_config
from roll_lite.data import DataProto

EOS = 2


def responses(lengths_and_ends: list[tuple[int, bool]], width: int = 12) -> DataProto:
    """Rows of a 2-token prompt then a response of `length` tokens, the last one EOS when `ends`."""
    rows = len(lengths_and_ends)
    input_ids, response_mask = torch.full((rows, width), 0), torch.zeros(rows, width, dtype=torch.long)
    for i, (length, ends) in enumerate(lengths_and_ends):
        input_ids[i, : 2 + length] = 5
        if ends:
            input_ids[i, 1 + length] = EOS
        response_mask[i, 2 : 2 + length] = 1
    return DataProto(
        {
            "input_ids": input_ids,
            "attention_mask": (input_ids != 0).long(),
            "response_mask": response_mask,
            "group_ids": torch.arange(rows) // 2,
        }
    )


def test_overlong_penalty_is_dapos_soft_punishment():
    lengths = torch.tensor([5, 7, 8, 9, 10, 10])
    truncated = torch.tensor([False, False, False, False, False, True])
    # L_max 10, L_cache 3: free up to 7, then (7 - |y|) / 3, and -1 when cut
    assert overlong_penalty(lengths, truncated, 10, 3).tolist() == pytest.approx([0, 0, -1 / 3, -2 / 3, -1, -1])


def test_truncated_responses_are_those_cut_at_the_limit_without_eos():
    batch = responses([(10, False), (10, True), (4, False), (3, True)])
    assert truncated_responses(batch, 10, EOS).tolist() == [True, False, False, False]


def test_overlong_filtering_masks_the_loss_only():
    batch = responses([(10, False), (6, True)])
    metrics = filter_overlong(batch, {}, 10, EOS)
    assert batch["response_mask"].sum(-1).tolist() == [0, 6] and metrics["dapo/overlong_filtered"] == 0.5


def test_informative_rows_are_those_of_groups_with_different_scores():
    assert informative_rows(
        torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5]), torch.tensor([0, 0, 1, 1, 2, 2])
    ).tolist() == [False, False, True, True, False, False]


class FakePipeline:
    """What keep_informative_groups uses: draw_prompts, generate, shaped_scores, and the config."""

    def __init__(self, rounds_of_scores, prompts_per_step=2, max_rounds=3):
        self.config = load_config(
            None,
            [
                f"rollout.prompts_per_step={prompts_per_step}",
                "rollout.num_samples=2",
                f"algorithm.max_sampling_rounds={max_rounds}",
            ],
        )
        self.algorithm, self.rounds = self.config.algorithm, list(rounds_of_scores)
        self.tokenizer = type("Tokenizer", (), {"pad_token_id": 0})()
        self.train_data = type("Rows", (), {"select": lambda _, rows: rows})()
        self.generated = 0

    def draw_prompts(self):
        return ([0], None)

    def sampling_params(self):
        return None

    def generate(self, prompts, params):
        self.generated += 1
        return batch_of(self.rounds[self.generated])

    def shaped_scores(self, batch):
        return batch["score"], {}


def batch_of(scores: list[float]) -> DataProto:
    rows = len(scores)
    return DataProto(
        {
            "score": torch.tensor(scores, dtype=torch.float64),
            "group_ids": torch.arange(rows) // 2,
            "input_ids": torch.arange(rows)[:, None],
        }
    )


def test_dynamic_sampling_draws_until_the_batch_is_full_and_cuts_the_extra_groups():
    rounds = [[1, 1, 0, 1], [0, 0, 1, 1], [0.5, 0, 1, 0, 0, 1]]  # informative groups: 1 / 0 / 3
    pipeline = FakePipeline(rounds, prompts_per_step=3)
    batch, scores, metrics = keep_informative_groups(pipeline, batch_of(rounds[0]), torch.tensor(rounds[0]), {})
    assert pipeline.generated == 2 and metrics["dapo/extra_rounds"] == 2
    assert batch["group_ids"].tolist() == [0, 0, 1, 1, 2, 2]  # renumbered, the 4th informative group cut
    assert scores.tolist() == [0, 1, 0.5, 0, 1, 0] and batch["input_ids"].flatten().tolist() == [2, 3, 0, 1, 2, 3]
    assert metrics["dapo/informative_groups"] == pytest.approx(4 / 7)
    assert metrics["reward/mean_sampled"] == pytest.approx(0.75)


def test_dynamic_sampling_trains_on_what_it_found_when_the_rounds_run_out(caplog):
    rounds = [[1, 1, 0, 1], [0, 0, 1, 1]]
    pipeline = FakePipeline(rounds, prompts_per_step=2, max_rounds=1)
    with caplog.at_level(logging.WARNING, logger="roll_lite"):
        batch, _, metrics = keep_informative_groups(pipeline, batch_of(rounds[0]), torch.tensor(rounds[0]), {})
    assert len(batch) == 2 and metrics["dapo/extra_rounds"] == 1
    assert "dynamic sampling: 1 of 2 informative groups after 1 extra round(s)" in caplog.text
    with caplog.at_level(logging.WARNING, logger="roll_lite"):
        batch, scores, _ = keep_informative_groups(
            FakePipeline([[1, 1, 0, 0]], max_rounds=0), batch_of([1, 1, 0, 0]), torch.tensor([1.0, 1, 0, 0]), {}
        )
    assert len(batch) == 4 and "no group with different scores in 2 groups" in caplog.text


@pytest.mark.parametrize(
    "overrides, error",
    [
        (
            ["algorithm.dynamic_sampling=true", "algorithm.advantage=gae"],
            "algorithm.dynamic_sampling: .* group estimator",
        ),
        (
            ["algorithm.dynamic_sampling=true", "rollout.async_steps=1"],
            "algorithm.dynamic_sampling: .* rollout.async_steps=0",
        ),
        (
            ["algorithm.overlong_buffer=11"],
            r"algorithm.overlong_buffer: must be null or in 1..rollout.max_new_tokens \(10\)",
        ),
        (["algorithm.max_sampling_rounds=-1"], "algorithm.max_sampling_rounds: must be >= 0"),
    ],
)
def test_dapo_config_errors_name_the_key(overrides, error):
    with pytest.raises(ConfigError, match=error):
        load_config(None, overrides)


def test_configs_dapo_trains_with_dynamic_sampling_and_overlong_shaping(data, tmp_path):  # noqa: F811
    tiny = [o for o in TINY if not o.startswith(("steps=", "eval_every"))]  # token_accuracy: graded scores
    log = run(
        [
            __import__("sys").executable,
            "-m",
            "roll_lite.cli",
            "--config",
            str(REPO / "configs/dapo.yaml"),
            *tiny,
            *data,
            "steps=3",
            "eval_every=3",
            f"output_dir={tmp_path}",
            "run_name=dapo",
            LOCAL,
        ]
    ).stderr
    steps = [r for r in metrics(tmp_path / "dapo") if r["step"] > 0]
    assert len(steps) == 3
    assert all(
        "dapo/informative_groups" in r and "dapo/overlong_filtered" in r and "dapo/overlong_penalty" in r for r in steps
    )
    lines = [line for line in log.splitlines() if " step " in line and "/3 | reward" in line]
    for r, line in zip(steps, lines, strict=True):  # each step's line: the share of groups found informative
        assert f"| informative {r['dapo/informative_groups']:.3g} |" in line, line
