"""MultiTurnPipeline's own parts, without workers: the batch of a step's episodes (model_mask, groups,
what faults and truncation do), rewards on each turn's last token, the credit each turn gets; and
the config around them."""

from __future__ import annotations

import json

import pytest
import torch
from roll_lite.pipelines.multi_turn import MultiTurnPipeline, episode_metrics

from roll_lite.config import ConfigError, load_config
from roll_lite.data.files import DataError
from roll_lite.environments.episodes import Episode
from roll_lite.environments.turns import Trajectory
from roll_lite.loss.advantages import discounted_returns, first_turn_returns, turn_level_advantages, turn_returns

MULTI_TURN = [
    "pipeline=roll_lite.pipelines.multi_turn:MultiTurnPipeline",
    "environment.name=guess_the_number",
    "model.chat_template=compact",
]


@pytest.fixture
def rows_file(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"secret": s}) + "\n" for s in (3, 9)))
    return str(path)


def pipeline_for(rows_file, *overrides) -> MultiTurnPipeline:
    pipeline = MultiTurnPipeline(load_config(None, [*MULTI_TURN, f"data.train_files={rows_file}", *overrides]))
    pipeline.prepare_data()
    return pipeline


def episode(row: int, sample: int, turns: list[tuple[int, float]], end="terminated", fault=None) -> Episode:
    """turns: (model tokens, the step's reward) each; observations of 3 tokens between them."""
    trajectory, turn_ends, position = Trajectory([1, 2]), [], 0
    for i, (tokens, _) in enumerate(turns):
        if i:
            trajectory.add_observation([7, 7, 7])
            position += 3
        trajectory.add_model_turn([5] * tokens, [-0.5] * tokens)
        position += tokens
        turn_ends.append(position - 1)
    return Episode(
        ("train", row, sample),
        trajectory,
        [r for _, r in turns],
        turn_ends,
        [f"t{i}" for i in range(len(turns))],
        end,
        fault,
        "boom" if fault else None,
    )


def test_the_batch_trains_the_models_tokens_and_rewards_sit_on_each_turns_last_token(rows_file):
    pipeline = pipeline_for(rows_file)
    episodes = [episode(0, 0, [(2, 0.0), (3, 1.0)]), episode(0, 1, [(1, 0.25)]), episode(1, 0, [(2, 0.0), (1, 0.0)])]
    pipeline.episodes = episodes
    batch = pipeline.episode_batch(episodes, step=1)
    assert batch.meta_info == {} and batch["group_ids"].tolist() == [0, 0, 1]
    # prompt [1, 2] | 5 5 | 7 7 7 | 5 5 5
    assert batch["model_mask"][0].tolist() == [0, 0, 1, 1, 0, 0, 0, 1, 1, 1]
    assert batch["response_mask"][0].tolist() == [0, 0] + [1] * 8
    assert batch["rollout_log_probs"][0].tolist() == [0, 0, -0.5, -0.5, 0, 0, 0, -0.5, -0.5, -0.5]
    _, scores, token_rewards, metrics = pipeline.rewards(batch)
    assert token_rewards[0].tolist() == [0] * 9 + [1.0] and token_rewards[1, 2].item() == 0.25
    assert scores.tolist() == [1.0, 0.25, 0.0]
    assert metrics["env/reward_mean"] == pytest.approx(1.25 / 3) and metrics["env/turns"] == pytest.approx(5 / 3)
    assert list(batch.non_tensor_batch["response_text"]) == ["t1", "t0", "t1"]
    assert list(batch.non_tensor_batch["extra"]) == [{"secret": 3}, {"secret": 3}, {"secret": 9}]


@pytest.mark.parametrize("on_fault", ["zero_reward", "drop"])
def test_a_faulted_trajectory_gets_reward_0_or_is_left_out_and_is_counted(rows_file, on_fault):
    pipeline = pipeline_for(rows_file, f"environment.on_fault={on_fault}")
    no_reset = Episode((0, 2), end="fault", fault="crashed", error="died")
    episodes = [episode(0, 0, [(2, 1.0)]), episode(0, 1, [(2, 0.5), (1, 1.0)], end="fault", fault="raised"), no_reset]
    pipeline.episodes = episodes
    batch = pipeline.episode_batch(episodes, step=1)
    assert len(batch) == (2 if on_fault == "zero_reward" else 1)  # a reset that faulted has nothing to train
    _, scores, _, metrics = pipeline.rewards(batch)
    assert scores.tolist() == ([1.0, 0.0] if on_fault == "zero_reward" else [1.0])
    assert metrics["env/faults/raised"] == 1 and metrics["env/faults/crashed"] == 1


@pytest.mark.parametrize("advantage, credit", [("rloo", "trajectory"), ("rloo", "turn"), ("grpo", "turn")])
def test_a_group_that_faults_left_with_one_trajectory_gets_advantage_0_and_is_counted(rows_file, advantage, credit):
    """RLOO stopped the run ("needs at least 2 samples per prompt"), and turn-level GRPO credited a
    lone trajectory's later turns (G_k - G_1) / eps."""
    overrides = [f"algorithm.advantage={advantage}", f"environment.credit={credit}", "environment.on_fault=drop"]
    pipeline = pipeline_for(rows_file, *overrides)
    episodes = [
        episode(0, 0, [(2, 1.0), (1, 0.5)]),
        episode(0, 1, [(2, 0.5)], end="fault", fault="raised"),
        episode(1, 0, [(2, 1.0)]),
        episode(1, 1, [(1, 0.0)]),
    ]
    pipeline.episodes = episodes
    batch = pipeline.episode_batch(episodes, step=1)
    _, scores, token_rewards, metrics = pipeline.rewards(batch)
    advantages, _ = pipeline.compute_advantages(scores, token_rewards, batch)
    assert batch["group_ids"].tolist() == [0, 1, 1] and metrics["env/groups_of_one"] == 1
    assert advantages[0].abs().sum() == 0 and (advantages[1] > 0).any() and (advantages[2] < 0).any()


def test_a_step_where_every_trajectory_faulted_stops_with_the_reasons(rows_file):
    pipeline = pipeline_for(rows_file)
    with pytest.raises(
        RuntimeError, match="no trajectory to train on: 2 ended in faults .*2 timed_out.*first error: slow"
    ):
        pipeline.episode_batch([Episode((0, 0), end="fault", fault="timed_out", error="slow")] * 2, step=3)


def test_truncated_trajectories_train_by_default_and_mask_keeps_them_out(rows_file):
    episodes = [episode(0, 0, [(2, 0.0), (2, 0.0)], end="max_turns"), episode(0, 1, [(2, 1.0)])]
    trained = pipeline_for(rows_file).episode_batch(episodes, 1)
    masked = pipeline_for(rows_file, "environment.truncated=mask").episode_batch(episodes, 1)
    assert trained["model_mask"][0].sum() == 4 and masked["model_mask"][0].sum() == 0
    assert torch.equal(trained["model_mask"][1], masked["model_mask"][1])


def test_episode_metrics_count_endings_turns_and_step_metrics():
    a = episode(0, 0, [(2, 0.0), (1, 1.0)])
    a.metrics.update(tool_calls=2, tool_errors=1)
    b = episode(0, 1, [(1, 0.0)], end="token_budget")
    metrics = episode_metrics([a, b], "eval", max_turns=5)
    assert metrics["eval/terminated"] == 0.5 and metrics["eval/truncated"] == 0.5
    assert metrics["eval/turns_when_terminated"] == 2 and metrics["eval/ended_token_budget"] == 0.5
    assert metrics["eval/turns_to_terminate"] == (2 + 6) / 2
    assert metrics["eval/tool_calls"] == 1 and metrics["eval/tool_errors"] == 0.5


# -- credit --------------------------------------------------------------------------------------

MASK = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 0, 1, 0], [0, 1, 1, 1, 0, 0, 0, 0, 0, 0]])


def rewards_at(values: dict) -> torch.Tensor:
    rewards = torch.zeros(MASK.shape, dtype=torch.float64)
    for (row, column), value in values.items():
        rewards[row, column] = value
    return rewards


def test_returns_skip_the_environments_tokens_instead_of_discounting_them():
    rewards = rewards_at({(0, 2): 1.0, (0, 8): 4.0})
    returns = discounted_returns(rewards, MASK, gamma=0.5)
    # model tokens 1 2 5 6 8 are five consecutive time steps: 4 at step 5 is worth 4·0.5^3 at position 2
    assert returns[0, 2].item() == 1.0 + 0.5**3 * 4 and returns[0, 8].item() == 4.0
    assert returns[0, [0, 3, 4, 7, 9]].abs().sum() == 0


def test_turn_returns_and_turn_level_credit_follow_their_formulas():
    rewards = rewards_at({(0, 2): 1.0, (0, 6): 2.0, (0, 8): 4.0, (1, 3): 3.0})
    g = turn_returns(rewards, MASK, gamma=0.5)
    assert g[0].tolist() == [0, 3, 3, 0, 0, 4, 4, 0, 4, 0]  # G3 = 4, G2 = 2 + 0.5·4, G1 = 1 + 0.5·4
    assert first_turn_returns(rewards, MASK, 1.0).tolist() == [7.0, 3.0]
    groups = torch.tensor([0, 0])
    grpo = turn_level_advantages(rewards, MASK, groups, "grpo", gamma=1.0)
    std = torch.tensor([7.0, 3.0]).std().item()
    expected = {1: (7 - 5) / std, 5: (6 - 5) / std, 8: (4 - 5) / std}
    for column, value in expected.items():
        assert grpo[0, column].item() == pytest.approx(value, rel=1e-5)
    assert turn_level_advantages(rewards, MASK, groups, "dr_grpo")[1, 1].item() == 3 - 5
    assert turn_level_advantages(rewards, MASK, groups, "rloo")[0, 8].item() == 4 - 3


def test_early_turns_of_a_trajectory_that_ends_well_get_its_credit():
    """SkyRL #1492: step-wise training gave early turns zero advantage. With the reward on the last
    turn only, every turn of the winner gets the same positive advantage, at either credit setting."""
    rewards = rewards_at({(0, 8): 1.0})
    groups = torch.tensor([0, 0])
    for advantages in (
        turn_level_advantages(rewards, MASK, groups, "grpo"),
        # trajectory credit: the pipeline's GRPO on the returns, broadcast over model_mask
        (lambda s: ((s - s.mean()) / (s.std() + 1e-6))[:, None] * MASK)(rewards.sum(-1)),
    ):
        winner = advantages[0][MASK[0].bool()]
        assert (winner > 0).all() and torch.allclose(winner, winner[0].expand_as(winner))


# -- config ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, error",
    [
        (["environment.name=guess_the_number"], "pipeline: environment.name asks for multi-turn rollouts"),
        ([*MULTI_TURN, "rollout.async_steps=1"], "rollout.async_steps: multi-turn rollouts .* are on-policy for now"),
        (
            [*MULTI_TURN, "data.train_files=x.jsonl", "rollout.fully_async=true", "rollout.on_update=drop"],
            "rollout.on_update: drop starts a row again, but an environment cannot be rewound",
        ),
        (
            [*MULTI_TURN, "data.train_files=x.jsonl", "rollout.fully_async=true", "rollout.segment_turns=0"],
            "rollout.segment_turns: must be >= 1, got 0",
        ),
        (MULTI_TURN, "data.train_files: multi-turn rollouts seed one environment per row"),
        (
            [*MULTI_TURN, "data.train_files=x.jsonl", "environment.credit=turn", "algorithm.advantage=gae"],
            "environment.credit: turn-level credit is for grpo, dr_grpo and rloo",
        ),
        (
            [*MULTI_TURN, "data.train_files=x.jsonl", "environment.max_turns=0"],
            "environment.max_turns: must be a whole number",
        ),
        (["model.chat_template=plain"], "model.chat_template: 'plain' is neither one of compact nor a Jinja template"),
    ],
)
def test_multi_turn_config_errors_name_the_key(overrides, error):
    with pytest.raises((ConfigError, ValueError), match=error):
        config = load_config(None, overrides)
        from roll_lite.model.tokenizer import load_tokenizer

        load_tokenizer(config.model.tokenizer_path, config.model.chat_template)


def test_the_pipeline_refuses_a_run_without_an_environment():
    with pytest.raises(ConfigError, match="environment.name: MultiTurnPipeline needs an environment"):
        MultiTurnPipeline(load_config(None, ["pipeline=roll_lite.pipelines.multi_turn:MultiTurnPipeline"]))


def test_drop_needs_the_final_reward_it_acts_on(rows_file):
    with pytest.raises(ConfigError, match="reward.on_failure: drop acts on what reward.functions, models and judges"):
        pipeline_for(rows_file, "reward.on_failure=drop")


@pytest.mark.parametrize("advantage, credit", [("grpo", "trajectory"), ("rloo", "trajectory"), ("grpo", "turn")])
def test_a_trajectory_the_final_reward_left_unscored_leaves_the_loss_and_its_groups_baseline(
    rows_file, advantage, credit
):
    """reward.on_failure=drop as in single-turn (pipelines/unscored.py): the kept trajectories' advantages
    are those of a batch of them alone; a group left with one scored trajectory gets none."""
    from roll_lite.pipelines.unscored import drop_unscored

    def scored_batch(pipeline, episodes, finals, scored):
        class Rewards:  # reward.functions on each last turn: these scores, `scored` the rows every function scored
            def score(self, responses, answers, extras):
                return torch.tensor(finals), torch.tensor(scored), {}

        pipeline.reward, pipeline.episodes = Rewards(), episodes
        batch = pipeline.episode_batch(episodes, step=1)
        _, scores, token_rewards, metrics = pipeline.rewards(batch)
        metrics = drop_unscored(batch, "model_mask", scores, {"reward/mean": scores.mean().item(), **metrics})
        return batch, pipeline.compute_advantages(scores, token_rewards, batch)[0], metrics

    overrides = ["reward.on_failure=drop", "environment.final_reward=true", f"algorithm.advantage={advantage}"]
    pipeline = pipeline_for(rows_file, *overrides, f"environment.credit={credit}")
    episodes = [
        episode(0, 0, [(2, 0.5), (3, 1.0)]),
        episode(0, 1, [(3, 0.0)]),  # unscored
        episode(0, 2, [(1, 0.25), (2, 0.0)]),
        episode(0, 3, [(2, 0.0)]),
        episode(1, 0, [(2, 1.0)]),
        episode(1, 1, [(1, 0.0), (1, 0.0)]),  # unscored: row 1 keeps one scored trajectory
    ]
    finals, scored = [1.0, 0.0, 0.5, 2.0, 1.0, 0.0], [True, False, True, True, True, False]
    batch, advantages, metrics = scored_batch(pipeline, episodes, finals, scored)
    assert metrics["reward/dropped"] == 2 and metrics["reward/mean"] == pytest.approx((2.5 + 0.75 + 2.0 + 2.0) / 4)
    assert batch["model_mask"][[1, 5]].sum() == 0 and batch["model_mask"][[0, 2, 3, 4]].sum() == 5 + 3 + 2 + 2
    assert advantages[[1, 4, 5]].abs().sum() == 0

    kept = [0, 2, 3]
    alone = pipeline_for(rows_file, *overrides, f"environment.credit={credit}")
    alone_batch, expected, _ = scored_batch(alone, [episodes[i] for i in kept], [finals[i] for i in kept], [True] * 3)
    assert expected.abs().sum() > 0 and expected.shape == advantages[kept].shape
    assert torch.equal(advantages[kept], expected)


def test_rows_are_drawn_by_domain_weight_and_a_row_without_a_weighed_domain_stops_the_run(tmp_path):
    path = tmp_path / "rows.jsonl"
    domains = ["easy", "hard", "easy", "hard", "hard"]
    path.write_text("".join(json.dumps({"secret": i, "domain": d}) + "\n" for i, d in enumerate(domains)))
    weights = "data.domain_weights={easy: 1.0, hard: 0.0}"
    pipeline = pipeline_for(str(path), weights)
    drawn = pipeline.sampler.draw(6)
    assert sorted(drawn) == [0, 0, 0, 2, 2, 2]  # the easy rows only, each once per pass
    resumed = pipeline_for(str(path), weights)  # a checkpoint holds the sampler's state
    resumed.sampler.load_state_dict(pipeline.sampler.state_dict())
    assert resumed.sampler.draw(4) == pipeline.sampler.draw(4)

    path.write_text(json.dumps({"secret": 2}) + "\n")
    with pytest.raises(
        DataError, match=r"data.train_files: .*rows.jsonl: row 0 \(line 1\): key 'domain' \(data.domain_key"
    ):
        pipeline_for(str(path), weights)
    path.write_text(json.dumps({"secret": 1, "domain": "odd"}) + "\n")
    with pytest.raises(
        DataError, match=r"row 0 .*: key 'domain': domain 'odd' has no weight in data.domain_weights \(easy, hard\)"
    ):
        pipeline_for(str(path), weights)


def test_the_pipeline_refuses_the_code_source_for_now(rows_file):
    with pytest.raises(ConfigError, match="reward.code: MultiTurnPipeline does not score with domains or code yet"):
        pipeline_for(rows_file, "reward.code=1.0", "reward.sandbox.isolation=rlimits")


def test_reward_models_and_judges_read_the_conversation_and_score_its_last_turn(rows_file, tmp_path):
    from test_reward_model import save_reward_model

    scorer = f"reward.models={{{save_reward_model(tmp_path / 'rm')}: 1.0}}"
    with pytest.raises(
        ConfigError,
        match="environment.final_reward: reward.models and reward.judges score a "
        "trajectory's last turn, which needs environment.final_reward=true",
    ):
        pipeline_for(rows_file, scorer)
    pipeline = pipeline_for(rows_file, scorer, "environment.final_reward=true")
    episodes = [episode(0, 0, [(2, 0.0), (3, 0.0)]), episode(1, 0, [(1, 0.0)])]
    pipeline.episodes = episodes
    batch = pipeline.episode_batch(episodes, step=1)
    seen = {}

    class Recording:
        def score(self, responses, answers, extras, prompts, sequences):
            seen.update(responses=responses, prompts=prompts, sequences=sequences)
            return torch.tensor([1.0, 0.0]), torch.ones(2, dtype=torch.bool), {}

    pipeline.reward = Recording()
    _, scores, token_rewards, _ = pipeline.rewards(batch)
    decode = pipeline.tokenizer.decode
    assert seen["responses"] == ["t1", "t0"]  # each trajectory's last model turn
    # prompt [1, 2] | turn 5 5 | observation 7 7 7 | last turn 5 5 5: the conversation before the last turn
    assert seen["prompts"] == [decode([1, 2, 5, 5, 7, 7, 7]), decode([1, 2])]
    assert seen["sequences"] == [[1, 2, 5, 5, 7, 7, 7, 5, 5, 5], [1, 2, 5]]  # the whole trajectory's ids
    assert token_rewards[0, 9].item() == 1.0 and scores.tolist() == [1.0, 0.0]


def test_final_reward_adds_the_reward_functions_score_on_the_last_turn(rows_file, monkeypatch):
    pipeline = pipeline_for(rows_file, "environment.final_reward=true")
    episodes = [episode(0, 0, [(2, 0.5), (2, 0.0)]), episode(0, 1, [(1, 0.0)], end="fault", fault="raised")]
    pipeline.episodes = episodes
    batch = pipeline.episode_batch(episodes, step=1)
    scored = []
    monkeypatch.setattr(
        pipeline,
        "score",
        lambda b: (
            scored.append(list(b.non_tensor_batch["response_text"])),
            (torch.tensor([2.0, 3.0]), {"reward/exact_answer": 2.5}),
        )[1],
    )
    _, scores, token_rewards, metrics = pipeline.rewards(batch)
    assert scored == [["t1", "t0"]]  # each trajectory's last model turn
    assert token_rewards[0, 3].item() == 0.5 and token_rewards[0, 8].item() == 2.0  # turn 1's step; turn 2's + final
    assert scores.tolist() == [2.5, 0.0] and metrics["reward/exact_answer"] == 2.5  # a faulted one gets 0


@pytest.mark.parametrize("advantage", ["grpo", "dr_grpo", "rloo", "reinforce_pp", "gae"])
def test_every_estimator_credits_the_models_tokens_only(rows_file, advantage):
    pipeline = pipeline_for(rows_file, f"algorithm.advantage={advantage}")
    episodes = [
        episode(0, 0, [(2, 0.0), (2, 1.0)]),
        episode(0, 1, [(3, 0.0)]),
        episode(1, 0, [(1, 0.0), (1, 1.0)]),
        episode(1, 1, [(2, 0.5)]),
    ]
    pipeline.episodes = episodes
    batch = pipeline.episode_batch(episodes, step=1)
    _, scores, token_rewards, _ = pipeline.rewards(batch)
    if advantage == "gae":
        batch.batch["values"] = torch.linspace(-1, 1, batch["model_mask"].numel()).view(batch["model_mask"].shape)
    advantages, returns = pipeline.compute_advantages(scores, token_rewards, batch)
    mask = batch["model_mask"].bool()
    assert advantages[~mask].abs().sum() == 0 and advantages[mask].abs().sum() > 0
    assert (returns is not None) == (advantage == "gae")
    if returns is not None:
        assert returns[~mask].abs().sum() == 0


def test_derived_environment_seeds_show_no_pattern_that_tells_training_from_eval(rows_file):
    """A row without a `seed` gets one hashed from data.seed, the split and the row. The affine formula
    before it made every training seed even and every eval seed odd: an environment that picks its task
    by seed % n trained on half of its tasks and was evaluated on the other half."""
    pipeline, rows = pipeline_for(rows_file, "seed=3"), range(4000)
    seeds = {split: [pipeline.environment_seed({}, row, split) for row in rows] for split in ("train", "eval")}
    for n in (2, 3, 4, 8):
        for split, drawn in seeds.items():
            shares = [sum(seed % n == r for seed in drawn) / len(drawn) for r in range(n)]
            assert max(abs(share - 1 / n) for share in shares) < 0.04, (split, n, shares)  # 5 standard deviations
    assert all(0 <= seed < 2**31 for drawn in seeds.values() for seed in drawn)
    assert len(set(seeds["train"]) | set(seeds["eval"])) == 2 * len(rows)
    assert [pipeline.environment_seed({}, row, "train") for row in rows] == seeds["train"]  # a resumed run replays them
    assert pipeline_for(rows_file, "seed=4").environment_seed({}, 0, "train") != seeds["train"][0]
    assert pipeline.environment_seed({"seed": 12}, 0, "eval") == 12  # the row's own seed wins
