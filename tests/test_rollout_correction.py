"""The rollout correction on the rollout engine's log-probs: truncated importance sampling (TIS), token
and sequence masking, the veto, bypass, and the mismatch metrics (the hf engine's log-probs themselves:
tests/test_hf_engine.py)."""

import math

import pytest
import torch

from roll_lite.data import DataProto
from roll_lite.loss import (
    RolloutCorrection,
    agg_loss,
    cispo_policy_loss_func,
    gspo_token_policy_loss_func,
    local_mask_stats,
    ppo_clipped_loss,
    ppo_policy_loss_func,
    rollout_correction,
    rollout_importance_weights,
    sequence_policy_loss_func,
)

MASK = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1]])
ACTOR = torch.tensor([[9.0, -1.0, -2.0, -0.5, 9.0], [9.0, 9.0, -1.0, -1.0, -3.0]])
ENGINE = torch.tensor([[-9.0, -1.5, -1.0, -0.5, -9.0], [-9.0, -9.0, -1.2, -0.1, -3.0]])


def test_token_weights_are_the_capped_ratio_and_zero_outside_the_mask():
    weights, capped = rollout_importance_weights(ACTOR, ENGINE, MASK, "token", cap=1.5)
    ratio = torch.exp(ACTOR - ENGINE)
    expected = torch.where(MASK.bool(), ratio.clamp(max=1.5), torch.zeros(()))
    assert torch.allclose(weights, expected)
    # row 0: e^0.5 = 1.65 is capped, e^-1 and e^0 are not; row 1: e^0.2 = 1.22, e^-0.9, e^0
    assert capped.tolist() == [[0, 1, 0, 0, 0], [0, 0, 0, 0, 0]]


def test_sequence_weights_are_the_capped_product_over_the_row():
    weights, capped = rollout_importance_weights(ACTOR, ENGINE, MASK, "sequence", cap=1.5)
    row0, row1 = math.exp(0.5 - 1.0 + 0.0), math.exp(0.2 - 0.9 + 0.0)  # the 9.0 / -9.0 outside the mask count not
    assert torch.allclose(weights[0], torch.tensor([0, row0, row0, row0, 0]))
    assert torch.allclose(weights[1], torch.tensor([0, 0, row1, row1, row1]))
    assert capped.sum() == 0
    weights, capped = rollout_importance_weights(ACTOR, ENGINE, MASK, "sequence", cap=0.5)
    assert torch.allclose(weights[0], torch.tensor([0, 0.5, 0.5, 0.5, 0])) and capped[0].tolist() == [0, 1, 1, 1, 0]


def test_bad_level_or_cap_is_refused():
    with pytest.raises(ValueError, match="'batch' is not one of token, sequence"):
        rollout_importance_weights(ACTOR, ENGINE, MASK, "batch", cap=2.0)
    with pytest.raises(ValueError, match="cap must be > 0"):
        rollout_importance_weights(ACTOR, ENGINE, MASK, "token", cap=0.0)


def rl_batch(with_engine_log_probs=True):
    advantages = torch.tensor([[0.0, 1.0, 1.0, 1.0, 0.0], [0.0, 0.0, -1.0, -1.0, -1.0]])
    tensors = {"response_mask": MASK, "old_log_probs": ACTOR, "advantages": advantages}
    if with_engine_log_probs:
        tensors["rollout_log_probs"] = ENGINE
    meta = {"batch_num_tokens": {"response_mask": 6}, "global_valid_samples": {"response_mask": 2}}
    return DataProto(tensors, meta_info=meta)


def test_the_ppo_loss_weights_each_token_and_reports_the_gap():
    batch = rl_batch()
    log_probs = ACTOR + 0.1 * torch.tensor([[1.0, 2.0, -1.0, 0.5, 3.0], [0.0, 1.0, 1.0, -2.0, 0.5]])
    loss, metrics = ppo_policy_loss_func("token-mean", rollout_is="token", rollout_is_cap=1.5)(
        batch, {"log_probs": log_probs}
    )
    masked = lambda t: torch.where(MASK.bool(), t, torch.zeros(()))  # noqa: E731
    loss_mat, _ = ppo_clipped_loss(masked(log_probs), masked(ACTOR), batch["advantages"])
    weights, _ = rollout_importance_weights(ACTOR, ENGINE, MASK, "token", cap=1.5)
    assert torch.allclose(
        loss, agg_loss(loss_mat * weights, MASK, "token-mean", batch_num_tokens=6, global_valid_samples=2)
    )
    gap = (masked(ACTOR) - masked(ENGINE)).abs()
    assert metrics["rollout_logp_gap@sum"].item() == pytest.approx(gap.sum().item() / 6)
    assert metrics["rollout_logp_gap_max@max"].item() == pytest.approx(1.0)  # never the 18 outside the mask
    assert metrics["rollout_is_capped@sum"].item() == pytest.approx(1 / 6)

    # off: the same loss as without the engine's log-probs, and the gap is still reported
    plain, metrics = ppo_policy_loss_func("token-mean")(batch, {"log_probs": log_probs})
    assert torch.allclose(plain, agg_loss(loss_mat, MASK, "token-mean", batch_num_tokens=6, global_valid_samples=2))
    assert "rollout_logp_gap@sum" in metrics and "rollout_is_weight@sum" not in metrics


def test_tis_without_the_engines_log_probs_is_an_error():
    with pytest.raises(KeyError, match="algorithm.rollout_is needs the rollout engine's log-probs"):
        ppo_policy_loss_func(rollout_is="token")(rl_batch(with_engine_log_probs=False), {"log_probs": ACTOR})


@pytest.mark.parametrize(
    "asked, metric",
    [
        ("algorithm.rollout_is=token", "rollout_is_weight"),
        ("algorithm.rollout_mask=token", "rollout_dropped"),
        ("algorithm.rollout_veto_threshold=4", "rollout_dropped"),
    ],
)
def test_a_loss_func_of_ones_own_that_ignores_an_asked_for_correction_stops_the_run(asked, metric):
    from roll_lite.pipelines.losses import check_correction_applied

    from roll_lite.config import ConfigError, load_config

    config = load_config(None, [asked])
    check_correction_applied(config.algorithm, {metric: 1.0, "pg_loss": 0.1}, "PPOPipeline")  # the built-ins report it
    key = asked.split("=")[0]
    with pytest.raises(ConfigError, match=f"{key}=.*: PlainPolicyGradient.loss_func applied no rollout correction"):
        check_correction_applied(config.algorithm, {"pg_loss": 0.1}, "PlainPolicyGradient")
    check_correction_applied(load_config(None, []).algorithm, {"pg_loss": 0.1}, "PlainPolicyGradient")  # none asked


# -- the correction suite: masks, veto, bypass, the k3 metric (hand-worked on ACTOR / ENGINE) --------------
# log π_actor - log π_rollout on the mask: row 0 (0.5, -1.0, 0.0), row 1 (0.2, -0.9, 0.0)
LOG_RATIO = [[0.5, -1.0, 0.0], [0.2, -0.9, 0.0]]


def correction_of(**settings):
    return rollout_correction(rl_batch(), ACTOR, MASK, local_mask_stats(MASK), correction=RolloutCorrection(**settings))


def test_token_masking_drops_the_tokens_outside_the_band_and_keeps_the_denominators():
    # ratios e^0.5 = 1.65 and e^-1 = 0.37 in row 0, e^-0.9 = 0.41 in row 1 are outside [0.5, 1.5]
    weights, metrics = correction_of(rollout_mask="token", rollout_mask_low=0.5, rollout_mask_high=1.5)
    assert weights.tolist() == [[0, 0, 0, 1, 0], [0, 0, 1, 0, 1]]
    assert metrics["rollout_token_masked@sum"].item() == pytest.approx(3 / 6)
    assert metrics["rollout_dropped@sum"].item() == pytest.approx(3 / 6)
    # in the loss: the dropped tokens' terms are 0, the token-mean still divides by all 6 tokens
    batch, log_probs = rl_batch(), (ACTOR + 0.1).requires_grad_()
    correction = RolloutCorrection(rollout_mask="token", rollout_mask_low=0.5, rollout_mask_high=1.5)
    loss, _ = ppo_policy_loss_func("token-mean", correction=correction)(batch, {"log_probs": log_probs})
    loss_mat, _ = ppo_clipped_loss(log_probs.detach(), ACTOR, batch["advantages"])
    assert loss.item() == pytest.approx((loss_mat * weights).sum().item() / 6)
    loss.backward()
    assert (log_probs.grad[weights == 0] == 0).all() and (log_probs.grad[weights == 1] != 0).all()


def test_sequence_masking_drops_whole_rows_by_their_geometric_mean_ratio():
    # geometric means: row 0 exp(-0.5 / 3) = 0.846, row 1 exp(-0.7 / 3) = 0.792: [0.8, 1.25] keeps row 0 only
    weights, metrics = correction_of(rollout_mask="sequence", rollout_mask_low=0.8, rollout_mask_high=1.25)
    assert weights.tolist() == [[0, 1, 1, 1, 0], [0, 0, 0, 0, 0]]
    assert metrics["rollout_seq_masked@sum"].item() == pytest.approx(1 / 2)  # a fraction of the sequences
    assert metrics["rollout_dropped@sum"].item() == pytest.approx(3 / 6)
    weights, _ = correction_of(rollout_mask="sequence", rollout_mask_low=0.75, rollout_mask_high=1.25)
    assert weights.tolist() == MASK.tolist()
    # the 9.0 / -9.0 outside the mask (log ratio 18) count nowhere: a band of [0.5, 2] keeps both rows
    assert correction_of(rollout_mask="sequence")[0].tolist() == MASK.tolist()


def test_the_veto_drops_a_row_with_any_token_ratio_beyond_tau_either_way():
    # log 2.5 = 0.92: row 0's -1.0 is beyond it (ratio 0.37 < 1 / 2.5), row 1's largest is 0.9
    weights, metrics = correction_of(rollout_veto_threshold=2.5)
    assert weights.tolist() == [[0, 0, 0, 0, 0], [0, 0, 1, 1, 1]]
    assert metrics["rollout_vetoed@sum"].item() == pytest.approx(1 / 2)
    assert metrics["rollout_dropped@sum"].item() == pytest.approx(3 / 6)
    # upwards too: with τ = 1.6 row 0's ratio e^0.5 = 1.65 alone would go; row 1's 0.41 < 1/1.6 goes
    weights, metrics = correction_of(rollout_veto_threshold=1.6)
    assert weights.sum() == 0 and metrics["rollout_vetoed@sum"].item() == pytest.approx(1.0)
    assert correction_of(rollout_veto_threshold=3.0)[0].tolist() == MASK.tolist()  # e^1.0 = 2.72 < 3


def test_tis_and_token_masking_combine_into_icepops_weight():
    # IcePop: the ratio itself inside [low, high], 0 outside (a cap >= high leaves it uncut)
    weights, metrics = correction_of(
        rollout_is="token", rollout_is_cap=5.0, rollout_mask="token", rollout_mask_low=0.4, rollout_mask_high=5.0
    )
    ratio = [[math.exp(x) for x in row] for row in LOG_RATIO]
    expected = [[0, ratio[0][0], 0, ratio[0][2], 0], [0, 0, ratio[1][0], ratio[1][1], ratio[1][2]]]  # e^-1 < 0.4
    assert torch.allclose(weights, torch.tensor(expected))
    assert metrics["rollout_token_masked@sum"].item() == pytest.approx(1 / 6)
    assert metrics["rollout_is_weight@sum"].item() == pytest.approx(sum(map(sum, ratio)) / 6)  # before the mask
    # a cap inside the band truncates what the band keeps: e^0.5 -> 1.5
    weights, metrics = correction_of(
        rollout_is="token", rollout_is_cap=1.5, rollout_mask="token", rollout_mask_low=0.4, rollout_mask_high=5.0
    )
    assert weights[0, 1].item() == pytest.approx(1.5) and metrics["rollout_is_capped@sum"].item() == pytest.approx(
        1 / 6
    )
    # and everything at once: TIS per sequence, the sequence mask, the veto
    weights, _ = correction_of(
        rollout_is="sequence",
        rollout_mask="sequence",
        rollout_mask_low=0.8,
        rollout_mask_high=1.25,
        rollout_veto_threshold=3.0,
    )
    assert torch.allclose(weights[0], torch.tensor([0, 1, 1, 1, 0]) * math.exp(-0.5)) and weights[1].sum() == 0


def test_the_k3_metric_estimates_kl_from_the_rollout_to_the_actor():
    k3 = sum(math.exp(x) - 1 - x for row in LOG_RATIO for x in row) / 6  # r = π_actor / π_rollout
    assert correction_of()[1]["rollout_kl_k3@sum"].item() == pytest.approx(k3)
    # its direction: tokens drawn from π_rollout in proportion (0.1, 0.2, 0.3, 0.4) of a 4-token vocabulary;
    # the token mean of k3 is then exactly Σ_x q(x) k3(x) = KL(π_rollout ‖ π_actor) (0.106), not the reverse (0.122)
    rollout, actor = (
        torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64),
        torch.full((4,), 0.25, dtype=torch.float64),
    )
    tokens = torch.tensor([0] + [1] * 2 + [2] * 3 + [3] * 4)
    mask = torch.ones(1, 10, dtype=torch.long)
    batch = DataProto({"rollout_log_probs": rollout.log()[tokens][None]}, meta_info={})
    _, metrics = rollout_correction(batch, actor.log()[tokens][None], mask, local_mask_stats(mask))
    assert metrics["rollout_kl_k3@sum"].item() == pytest.approx((rollout * (rollout / actor).log()).sum().item())
    assert metrics["rollout_kl_k3@sum"].item() != pytest.approx(
        (actor * (actor / rollout).log()).sum().item(), rel=0.05
    )


def test_bypass_takes_the_engines_log_probs_as_the_old_policy():
    """The loss with rollout_bypass equals the loss with old_log_probs replaced by rollout_log_probs."""
    log_probs = ACTOR + 0.1 * torch.tensor([[1.0, 2.0, -1.0, 0.5, 3.0], [0.0, 1.0, 1.0, -2.0, 0.5]])
    for factory in (
        ppo_policy_loss_func,
        sequence_policy_loss_func,
        cispo_policy_loss_func,
        gspo_token_policy_loss_func,
    ):
        bypassed, metrics = factory("token-mean", correction=RolloutCorrection(rollout_bypass=True))(
            rl_batch(), {"log_probs": log_probs.clone().requires_grad_()}
        )
        replaced = rl_batch()
        replaced.batch["old_log_probs"] = ENGINE
        plain, _ = factory("token-mean")(replaced, {"log_probs": log_probs})
        assert bypassed.item() == pytest.approx(plain.item()), factory.__name__
        # the gap and k3 are still between the actor's own old log-probs and the engine's
        assert metrics["rollout_logp_gap@sum"].item() == pytest.approx(2.6 / 6)
    # with a mask on top, the mask reads π_actor / π_rollout (the actor's old log-probs), the ratio π_θ / π_rollout
    correction = RolloutCorrection(
        rollout_bypass=True, rollout_mask="token", rollout_mask_low=0.5, rollout_mask_high=1.5
    )
    masked, _ = ppo_policy_loss_func("token-mean", correction=correction)(rl_batch(), {"log_probs": log_probs})
    loss_mat, _ = ppo_clipped_loss(log_probs, torch.where(MASK.bool(), ENGINE, 0.0), rl_batch()["advantages"])
    keep = torch.tensor([[0, 0, 0, 1, 0], [0, 0, 1, 0, 1]])
    assert masked.item() == pytest.approx((loss_mat * keep).sum().item() / 6)


def test_bypass_without_old_log_probs_reads_the_training_forward():
    """A step that skipped the old log-probs' forward (bypass, not on-policy): π_actor is the
    training forward's, detached, for the metrics and masks; without the engine's it is an error."""
    batch = rl_batch()
    del batch.batch["old_log_probs"]
    log_probs = ACTOR + 0.1
    _, metrics = ppo_policy_loss_func(correction=RolloutCorrection(rollout_bypass=True))(
        batch, {"log_probs": log_probs}
    )
    gap = torch.where(MASK.bool(), (log_probs - ENGINE).abs(), 0.0).sum() / 6
    assert metrics["rollout_logp_gap@sum"].item() == pytest.approx(gap.item())
    with pytest.raises(KeyError, match="the batch has no 'old_log_probs'"):
        ppo_policy_loss_func()(batch, {"log_probs": log_probs})
    with pytest.raises(KeyError, match="algorithm.rollout_bypass needs the rollout engine's log-probs"):
        ppo_policy_loss_func(correction=RolloutCorrection(rollout_bypass=True))(rl_batch(False), {"log_probs": ACTOR})
    with pytest.raises(KeyError, match="algorithm.rollout_mask / algorithm.rollout_veto_threshold needs the rollout"):
        correction = RolloutCorrection(rollout_mask="token", rollout_veto_threshold=2.0)
        sequence_policy_loss_func(correction=correction)(rl_batch(False), {"log_probs": ACTOR})


def test_bad_settings_are_refused_by_the_loss_and_by_the_config():
    from roll_lite.config import ConfigError, load_config

    for settings, message in [
        ({"rollout_mask": "batch"}, "rollout_mask: 'batch' is not one of token, sequence"),
        ({"rollout_mask_low": 1.0}, r"rollout_mask_low: the band \[low, high\] must hold 1"),
        ({"rollout_mask_high": 0.9}, "rollout_mask_low: the band"),
        ({"rollout_veto_threshold": 1e-4}, "rollout_veto_threshold: must be > 1 or null"),
        ({"rollout_bypass": True, "rollout_is": "token"}, "rollout_bypass: the engine's log-probs are then π_old"),
    ]:
        with pytest.raises(ValueError, match=message):
            RolloutCorrection(**settings)
        with pytest.raises(ConfigError, match="algorithm." + message):
            load_config(None, [f"algorithm.{key}={value}" for key, value in settings.items()])
    with pytest.raises(ValueError, match="pass rollout_is inside correction"):
        ppo_policy_loss_func(rollout_is="token", correction=RolloutCorrection())


def test_the_config_keys_reach_the_built_in_losses():
    from roll_lite.pipelines.losses import policy_loss_func

    from roll_lite.config import load_config

    batch = rl_batch()
    batch.meta_info["loss_mask_keys"] = ["response_mask"]
    for name in ("ppo", "gspo", "cispo"):
        config = load_config(
            None,
            [
                f"algorithm.policy_loss={name}",
                "algorithm.rollout_mask=token",
                "algorithm.rollout_mask_high=1.5",
                "algorithm.rollout_veto_threshold=10",
            ],
        )
        for use_reference in (False, True):
            if use_reference:
                batch.batch["ref_log_probs"] = ACTOR
            _, metrics = policy_loss_func(config.algorithm, "response_mask", 8.0, use_reference)(
                batch, {"log_probs": ACTOR}
            )
            assert metrics["rollout_token_masked@sum"].item() == pytest.approx(3 / 6), name
            assert metrics["rollout_vetoed@sum"] == 0


def test_the_exactness_matrix_corrections_drop_some_tokens_but_not_all():
    """tests/loss_cases.py's correction entries: each mask and the veto bites on its batch."""
    from loss_cases import MASK_KEYS, global_batch, make_loss

    data = global_batch(torch.float64)
    key = "response_mask"
    data.meta_info.update(
        batch_num_tokens={key: data[key].sum()}, global_valid_samples={key: (data[key].sum(-1) > 0).sum()}
    )
    output = {"log_probs": data["old_log_probs"] + 0.05, "entropy": torch.ones_like(data["old_log_probs"])}
    seen = {}
    for name in ("ppo_mis", "gspo_seqmask", "ppo_bypass"):
        assert MASK_KEYS[name] == [key]
        _, metrics = make_loss(name, "token-mean")(data, output)
        seen.update({k: v.item() for k, v in metrics.items() if k.startswith("rollout_")})
    for metric in ("rollout_token_masked@sum", "rollout_seq_masked@sum", "rollout_vetoed@sum", "rollout_dropped@sum"):
        assert 0.05 < seen[metric] < 0.8, (metric, seen)


def test_bypass_trains_generating_ahead_without_recomputing_the_old_log_probs(tmp_path):
    from test_resume import REPO, command, metrics, run

    for name in ("train", "eval"):
        lines = (REPO / f"data/reverse_digits/{name}.jsonl").read_text().splitlines(keepends=True)[:8]
        (tmp_path / f"{name}.jsonl").write_text("".join(lines))
    rows = [f"data.train_files={tmp_path / 'train.jsonl'}", f"data.eval_files={tmp_path / 'eval.jsonl'}"]
    args = command(
        rows,
        tmp_path,
        "bypass",
        "steps=2",
        "eval_every=2",
        "rollout.async_steps=1",
        "algorithm.rollout_bypass=true",
        "algorithm.rollout_mask=token",
        "algorithm.rollout_veto_threshold=100",
    )
    log = run(args).stderr
    assert "the engine's log-probs serve as the old ones" in log
    steps = [r for r in metrics(tmp_path / "bypass") if r["step"] > 0]
    assert len(steps) == 2 and all("actor/rollout_dropped" in r and "actor/rollout_kl_k3" in r for r in steps)
