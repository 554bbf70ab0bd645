"""algorithm.policy_loss: CISPO and GSPO-token against hand-worked values, each name selecting its
loss in the pipeline, a user's loss by import path, and roll-train checking a user's loss first."""

from __future__ import annotations

import math
import sys

import pytest
import torch
import warm_driver
from roll_lite.pipelines.loss_check import LossCheckFailed, check_own_losses
from roll_lite.pipelines.ppo import PPOPipeline
from user_modules import user_module

from roll_lite.config import ConfigError, load_config
from roll_lite.data import DataProto
from roll_lite.loss import (
    POLICY_LOSSES,
    cispo_loss,
    cispo_policy_loss_func,
    kl_regularized_loss_func,
    sequence_policy_loss_func,
    sequence_ratio_token_loss,
)
from roll_lite.loss.checker import random_rl_batch

REPO = __import__("pathlib").Path(__file__).resolve().parents[1]

USER_LOSSES = """
from roll_lite.loss import agg_loss, mask_stats, masked_sum, zero_outside


def good(batch, output):
    mask, stats = batch["response_mask"], mask_stats(batch.meta_info, "response_mask")
    log_probs, advantages = zero_outside(mask, output["log_probs"], batch["advantages"])
    return agg_loss(-advantages * log_probs, mask, "token-mean", **stats), {}


def needs_a_key(batch, output):  # reads a key the checker's batch does not have
    return (output["log_probs"] * batch["my_weights"]).sum(), {}


def local_mean(batch, output):  # the classic bug: the micro-batch's own token count
    mask = batch["response_mask"]
    return -masked_sum(output["log_probs"] * batch["advantages"], mask) / mask.sum().clamp(min=1), {}
"""


@pytest.fixture(scope="module")
def losses_module(tmp_path_factory):
    with user_module(tmp_path_factory, "user_losses", USER_LOSSES) as name:
        yield name


def one_row(log_probs, old_log_probs, advantages):
    mask = torch.ones(1, len(log_probs), dtype=torch.long)
    meta = {
        "loss_mask_keys": ["response_mask"],
        "batch_num_tokens": {"response_mask": torch.tensor(float(mask.sum()))},
        "global_valid_samples": {"response_mask": torch.tensor(1.0)},
    }
    batch = DataProto(
        {
            "response_mask": mask,
            "old_log_probs": torch.tensor([old_log_probs], dtype=torch.float64),
            "advantages": torch.tensor([advantages], dtype=torch.float64),
        },
        meta_info=meta,
    )
    log_probs = torch.tensor([log_probs], dtype=torch.float64, requires_grad=True)
    return batch, log_probs


def test_cispo_clips_the_detached_weight_not_the_update():
    # ratios 2.0 and 0.5; MiniMax-M1's default range [0, 1.28]: weights 1.28 and 0.5
    batch, log_probs = one_row([math.log(0.5), math.log(0.2)], [math.log(0.25), math.log(0.4)], [1.0, -2.0])
    loss_mat, clipped = cispo_loss(log_probs, batch["old_log_probs"], batch["advantages"])
    assert loss_mat.tolist()[0] == pytest.approx([-1.28 * math.log(0.5), -0.5 * -2.0 * math.log(0.2)])
    assert clipped.tolist() == [[1.0, 0.0]]
    loss, metrics = cispo_policy_loss_func()(batch, {"log_probs": log_probs})
    loss.backward()
    assert loss.item() == pytest.approx((-1.28 * math.log(0.5) + math.log(0.2)) / 2)  # token-mean
    # every token keeps its gradient: -w·A per token, even the clipped one (PPO would give it 0)
    assert log_probs.grad.tolist()[0] == pytest.approx([-1.28 / 2, 1.0 / 2])
    assert metrics["clipfrac@sum"].item() == pytest.approx(0.5)


def test_gspo_token_is_gspo_when_a_row_has_one_advantage_and_per_token_otherwise():
    old = [-1.0, -2.0, -0.5]
    for advantages in ([0.7, 0.7, 0.7], [1.0, -1.0, 0.5]):
        results = []
        for token_level in (False, True):
            batch, log_probs = one_row([-0.9, -2.1, -0.45], old, advantages)
            loss, _ = sequence_policy_loss_func(clip_ratio_low=0.5, clip_ratio_high=0.5, token_level=token_level)(
                batch, {"log_probs": log_probs}
            )
            loss.backward()
            results.append((loss.item(), log_probs.grad.clone()))
        if advantages[0] == advantages[1]:
            assert results[0][0] == pytest.approx(results[1][0]) and torch.allclose(results[0][1], results[1][1])
        else:
            s = math.exp(sum(a - b for a, b in zip([-0.9, -2.1, -0.45], old)) / 3)  # the sequence ratio, unclipped
            # value: mean_t -A_t·s; gradient of token t: -A_t·s / 3 (GSPO would give every token -mean(A)·s / 3)
            assert results[1][0] == pytest.approx(-s * sum(advantages) / 3)
            assert results[1][1].tolist()[0] == pytest.approx([-a * s / 3 for a in advantages])


def test_gspo_token_clips_per_sequence():
    batch, log_probs = one_row([0.0, 0.0], [-1.0, -1.0], [1.0, 1.0])  # s = e > 1 + 0.2
    loss_mat, clipped = sequence_ratio_token_loss(
        log_probs, batch["old_log_probs"], batch["advantages"], batch["response_mask"], 0.2, 0.2
    )
    assert loss_mat.tolist()[0] == pytest.approx([-1.2, -1.2]) and clipped.tolist() == [[1.0, 1.0]]


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_each_name_selects_its_loss_with_its_own_clip_defaults(name):
    pipeline = PPOPipeline(load_config(None, [f"algorithm.policy_loss={name}", "algorithm.track_kl=false"]))
    data = random_rl_batch(seed=3)
    data.meta_info.update(
        batch_num_tokens={"response_mask": data["response_mask"].sum().double()},
        global_valid_samples={"response_mask": (data["response_mask"].sum(-1) > 0).sum().double()},
    )
    output = {
        "log_probs": data["old_log_probs"]
        + 0.4
        * torch.randn(data["old_log_probs"].shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    }
    expected = POLICY_LOSSES[name]("token-mean", seq_len_norm=10)(data, output)[0]
    assert pipeline.loss_func(data, output)[0].item() == expected.item()
    if name != "ppo":  # another loss gives another number on the same batch
        assert expected.item() != POLICY_LOSSES["ppo"]("token-mean")(data, output)[0].item()


def test_a_reference_adds_the_kl_around_any_policy_loss():
    pipeline = PPOPipeline(load_config(None, ["algorithm.policy_loss=cispo", "algorithm.kl_coef=0.3"]))
    data = random_rl_batch(seed=4)
    data.meta_info.update(
        batch_num_tokens={"response_mask": data["response_mask"].sum().double()},
        global_valid_samples={"response_mask": (data["response_mask"].sum(-1) > 0).sum().double()},
    )
    output = {"log_probs": data["old_log_probs"] * 1.1}
    expected = kl_regularized_loss_func(
        "token-mean", kl_coef=0.3, kl_mask_key="response_mask", policy_loss=cispo_policy_loss_func(seq_len_norm=10)
    )(data, output)
    got = pipeline.loss_func(data, output)
    assert got[0].item() == expected[0].item() and "kl@sum" in got[1]


def test_a_users_loss_by_import_path_is_used_and_checked_first(losses_module):
    good = PPOPipeline(load_config(None, [f"algorithm.policy_loss={losses_module}:good", "algorithm.track_kl=false"]))
    data = random_rl_batch(seed=5)
    data.meta_info.update(
        batch_num_tokens={"response_mask": data["response_mask"].sum().double()},
        global_valid_samples={"response_mask": (data["response_mask"].sum(-1) > 0).sum().double()},
    )
    output = {"log_probs": data["old_log_probs"]}
    assert good.loss_func(data, output)[0].item() == pytest.approx(
        (-(data["advantages"] * data["old_log_probs"]) * data["response_mask"]).sum().item()
        / data["response_mask"].sum().item()
    )
    # it reports no engine-vs-actor gap: the fresh-weights check (rollout.max_logp_gap) would stop the run
    # after step 1, so the check before training stops it instead, naming the metric
    with pytest.raises(
        LossCheckFailed, match=r"reports no 'rollout_logp_gap@sum' \(it reports nothing\).*rollout_correction"
    ):
        check_own_losses(good)
    unchecked_gap = PPOPipeline(
        load_config(
            None,
            [f"algorithm.policy_loss={losses_module}:good", "algorithm.track_kl=false", "rollout.max_logp_gap=null"],
        )
    )
    assert check_own_losses(unchecked_gap).startswith("loss check: loss_func passed")
    assert check_own_losses(PPOPipeline(load_config(None, []))) is None  # built-ins are tested, not re-checked
    bad = PPOPipeline(load_config(None, [f"algorithm.policy_loss={losses_module}:local_mean"]))
    with pytest.raises(LossCheckFailed, match="normalises by the micro-batch's own loss_mask.sum") as failed:
        check_own_losses(bad)
    # what failed and how to fix it first, the deviations next, the switch that skips the check last
    lines = str(failed.value).splitlines()
    assert lines[0] == f"PPOPipeline.loss_func ({losses_module}:local_mean) fails the loss checker:"
    assert lines[1].startswith("FAIL partitions: the step under ") and lines[2].startswith("likely cause: ")
    assert lines[-2].startswith("FAIL: worst relative deviation")
    assert lines[-1].startswith("algorithm.check_loss=false skips this check: only for a loss that needs batch keys")
    raising = PPOPipeline(load_config(None, [f"algorithm.policy_loss={losses_module}:needs_a_key"]))
    with pytest.raises(
        LossCheckFailed, match="raised on the checker's synthetic batch: KeyError: .*no tensor 'my_weights'"
    ):
        check_own_losses(raising)
    skipped = PPOPipeline(
        load_config(None, [f"algorithm.policy_loss={losses_module}:local_mean", "algorithm.check_loss=false"])
    )
    assert check_own_losses(skipped) == "loss check: skipped (algorithm.check_loss=false) for loss_func"


def test_a_pair_pipelines_own_loss_is_checked_on_pairs_with_the_pipelines_declaration():
    """A DPO or reward-model subclass's loss_func goes through the checker on preference pairs laid out and
    declared as the pipelines lay out theirs; the built-in pair losses are tested, not re-checked."""
    from roll_lite.pipelines.dpo import DPOPipeline
    from roll_lite.pipelines.reward_model import RewardModelPipeline
    from test_invariance import local_mean_dpo

    class OwnDPO(DPOPipeline):
        def loss_func(self, batch, output):  # DPO, written out as a user would
            return super().loss_func(batch, output)

    class LocalMeanDPO(DPOPipeline):
        def loss_func(self, batch, output):
            return local_mean_dpo(batch, output)

    class OwnRewardModel(RewardModelPipeline):
        def loss_func(self, batch, output):
            return super().loss_func(batch, output)

    dpo, reward_model = load_config(REPO / "configs/dpo.yaml", []), load_config(REPO / "configs/reward_model.yaml", [])
    tokenizer = object()  # neither builds nor checks a batch from data
    assert check_own_losses(DPOPipeline(dpo, tokenizer)) is None
    assert check_own_losses(RewardModelPipeline(reward_model, tokenizer)) is None
    assert check_own_losses(OwnDPO(dpo, tokenizer)).startswith("loss check: loss_func passed")
    assert check_own_losses(OwnRewardModel(reward_model, tokenizer)).startswith("loss check: loss_func passed")
    with pytest.raises(LossCheckFailed) as failed:
        check_own_losses(LocalMeanDPO(dpo, tokenizer))
    lines = str(failed.value).splitlines()
    assert lines[0] == "LocalMeanDPO.loss_func (pair loss) fails the loss checker:"
    assert lines[1].startswith("FAIL partitions:") and "the micro-batch's own pair count" in lines[2]
    assert lines[-1].startswith("algorithm.check_loss=false skips this check")


@pytest.fixture(scope="module")
def docs_loss(tmp_path_factory):
    import doc_commands

    with user_module(tmp_path_factory, "docs_loss", doc_commands.python_blocks_defining("my_loss")[0].body) as name:
        yield f"{name}:my_loss"


@pytest.mark.parametrize(
    "correction, metrics",
    [
        (["algorithm.rollout_is=token"], "'rollout_is_weight@sum'"),
        (["algorithm.rollout_mask=token", "algorithm.rollout_veto_threshold=4.0"], "'rollout_dropped@sum'"),
    ],
)
def test_a_correction_the_loss_does_not_apply_fails_the_check_naming_the_metric(docs_loss, correction, metrics):
    """docs/custom-losses.md's my_loss (the README's example) reports the engine-vs-actor gap but applies
    no correction: with one configured, the loss check stops the run before training
    (check_correction_applied would stop it after the first step), naming the metric the loss must report."""
    plain = PPOPipeline(load_config(None, [f"algorithm.policy_loss={docs_loss}"]))
    assert check_own_losses(plain).startswith("loss check: loss_func passed")
    corrected = PPOPipeline(load_config(None, [f"algorithm.policy_loss={docs_loss}", *correction]))
    with pytest.raises(LossCheckFailed) as failed:
        check_own_losses(corrected)
    settings = ", ".join(correction)
    assert (
        str(failed.value).startswith(f"PPOPipeline.loss_func reports no {metrics} (it reports [")
        and f"so the rollout correction of {settings} would not be applied" in str(failed.value)
        and "\n" not in str(failed.value)
    )
    # a loss that applies the correction passes as before: examples/custom_loss's subclass passes rollout_is
    from examples.custom_loss.pipeline import CappedAdvantagePipeline

    example = CappedAdvantagePipeline(load_config(None, ["algorithm.rollout_is=token"]))
    assert check_own_losses(example).startswith("loss check: loss_func passed")


def test_roll_train_stops_on_a_users_loss_that_fails_the_check_before_anything_starts(losses_module, tmp_path):
    folder = sys.modules[losses_module].__file__.rsplit("/", 1)[0]
    result = warm_driver.run(
        [
            sys.executable,
            "-m",
            "roll_lite.cli",
            f"algorithm.policy_loss={losses_module}:local_mean",
            f"output_dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**__import__("os").environ, "PYTHONPATH": folder},
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "roll-train: loss check: PPOPipeline.loss_func" in result.stderr
    assert "likely cause" in result.stderr and "algorithm.check_loss=false" in result.stderr
    assert not any(tmp_path.iterdir())  # nothing written, no Ray started


@pytest.mark.parametrize(
    "overrides, error",
    [
        (["algorithm.policy_loss=grpo"], "algorithm.policy_loss: 'grpo' is not one of cispo, gspo, gspo_token, ppo"),
        (["algorithm.policy_loss=gspo", "algorithm.dual_clip_c=3"], "algorithm.dual_clip_c: dual clip is ppo's"),
        (["algorithm.policy_loss=gspo", "algorithm.entropy_coef=0.01"], "algorithm.entropy_coef: the entropy bonus"),
        (["algorithm.clip_ratio_high=-0.1"], "algorithm.clip_ratio_high: must be >= 0 or null"),
        (["algorithm.policy_loss=no_such_module:loss"], "algorithm.policy_loss: cannot import 'no_such_module:loss'"),
    ],
)
def test_policy_loss_config_errors_name_the_key(overrides, error):
    with pytest.raises(ConfigError, match=error):
        load_config(None, overrides)
