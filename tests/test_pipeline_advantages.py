"""PPOPipeline.compute_advantages: which estimators whiten (algorithm.whiten_advantages), and the
critic's returns stay un-whitened; against values worked out by hand."""

import pytest
import torch
from roll_lite.pipelines.ppo import PPOPipeline

from roll_lite.config import load_config

D = torch.float64
# row 0: response tokens 1..2, reward 1 on the last; row 1: response token 1 only, reward 2
MASK = torch.tensor([[0, 1, 1], [0, 1, 0]])
REWARDS = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]], dtype=D)
VALUES = torch.tensor([[9.0, 0.5, 0.25], [9.0, 1.0, 9.0]], dtype=D)
BATCH = {"response_mask": MASK, "values": VALUES, "group_ids": torch.tensor([0, 0])}


def advantages(*overrides):
    pipeline = PPOPipeline(load_config(None, ["rollout.num_samples=2", *overrides]))
    return pipeline.compute_advantages(REWARDS.sum(-1), REWARDS, BATCH)


def test_gae_is_whitened_by_default_and_returns_are_not():
    # gamma = lambda = 1: advantage = return - value = (1 - 0.5, 1 - 0.25) and 2 - 1 -> 0.5, 0.75, 1.0;
    # mean 0.75, unbiased std sqrt((0.0625 + 0 + 0.0625) / 2) = 0.25 -> -1, 0, 1
    adv, ret = advantages("algorithm.advantage=gae", "algorithm.lam=1.0")
    assert adv[MASK.bool()].tolist() == pytest.approx([-1.0, 0.0, 1.0], abs=1e-6)
    assert ret[MASK.bool()].tolist() == pytest.approx([1.0, 1.0, 2.0])  # raw advantages + values
    assert adv[~MASK.bool()].abs().sum() == 0 and ret[~MASK.bool()].abs().sum() == 0
    adv, ret = advantages("algorithm.advantage=gae", "algorithm.lam=1.0", "algorithm.whiten_advantages=false")
    assert adv[MASK.bool()].tolist() == pytest.approx([0.5, 0.75, 1.0])
    assert ret[MASK.bool()].tolist() == pytest.approx([1.0, 1.0, 2.0])


def test_group_estimators_are_not_whitened_unless_asked():
    # rloo, one group of two: 1 - 2 = -1 and 2 - 1 = 1 on every response token
    adv, ret = advantages("algorithm.advantage=rloo")
    assert ret is None and adv[MASK.bool()].tolist() == pytest.approx([-1.0, -1.0, 1.0])
    # whitened over the 3 tokens: mean -1/3, unbiased variance (4/9 + 4/9 + 16/9) / 2 = 4/3
    adv, _ = advantages("algorithm.advantage=rloo", "algorithm.whiten_advantages=true")
    s3 = 3**0.5
    assert adv[MASK.bool()].tolist() == pytest.approx([-1 / s3, -1 / s3, 2 / s3], rel=1e-6)


def test_reinforce_pp_whitens_by_default():
    # returns (1, 1) and (2): mean 4/3, unbiased variance (1/9 + 1/9 + 4/9) / 2 = 1/3
    adv, ret = advantages("algorithm.advantage=reinforce_pp")
    s3 = 3**0.5
    assert ret is None and adv[MASK.bool()].tolist() == pytest.approx([-1 / s3, -1 / s3, 2 / s3], rel=1e-6)
    adv, _ = advantages("algorithm.advantage=reinforce_pp", "algorithm.whiten_advantages=false")
    assert adv[MASK.bool()].tolist() == pytest.approx([1.0, 1.0, 2.0])


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_unscored_rows_leave_their_groups_baselines(estimator):
    """reward.on_failure=drop: the estimator on the scored rows alone, group by group; unscored rows and
    the rows of a group left with fewer than two scored ones get 0."""
    from roll_lite.pipelines.unscored import drop_unscored

    from roll_lite.data import DataProto

    pipeline = PPOPipeline(load_config(None, ["rollout.num_samples=4", f"algorithm.advantage={estimator}"]))
    scores = torch.tensor([1.0, 0.0, 7.0, 0.5, 3.0, 2.0, 9.0, 1.0], dtype=D)
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    scored = torch.tensor([True, True, False, True, True, False, False, False])  # group 1 keeps one row
    mask = torch.tensor([[0, 1, 1]] * 8)
    rewards = torch.zeros(8, 3, dtype=D)
    rewards[:, 2] = scores
    batch = DataProto({"response_mask": mask.clone(), "group_ids": groups, "scored": scored})
    metrics = drop_unscored(batch, "response_mask", scores.float(), {"reward/mean": 0.0})
    assert batch["response_mask"][~scored].sum() == 0 and torch.equal(batch["response_mask"][scored], mask[scored])
    assert metrics["reward/dropped"] == 4 and metrics["reward/mean"] == pytest.approx((1.0 + 0.0 + 0.5 + 3.0) / 4)

    advantages, _ = pipeline.compute_advantages(scores, rewards, batch)
    kept = [0, 1, 3]  # group 0's scored rows
    alone = PPOPipeline(load_config(None, ["rollout.num_samples=3", f"algorithm.advantage={estimator}"]))
    expected, _ = alone.compute_advantages(
        scores[kept], rewards[kept], {"response_mask": mask[kept], "group_ids": groups[kept]}
    )
    assert torch.equal(advantages[kept], expected)
    assert advantages[[2, 4, 5, 6, 7]].abs().sum() == 0  # unscored, or alone in its group
