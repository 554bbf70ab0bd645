"""nan/inf outside the loss masks change nothing; nan/inf inside them stop the run with a clear error.

Every built-in loss zeroes its inputs outside its mask before any arithmetic, so a step on a batch
poisoned there equals the clean step bit for bit (loss and every gradient), padded and packed.
"""

import pytest
import torch

from roll_lite.loss import (
    kl_regularized_loss_func,
    ppo_policy_loss_func,
    sequence_policy_loss_func,
    sft_loss_func,
    value_loss_func,
)
from roll_lite.loss.checker import TINY_MODEL, Partition, _model_with_head, random_rl_batch, simulate_step
from roll_lite.model.modeling import build_causal_lm
from roll_lite.strategy import FSDP2Strategy, StrategyConfig
from roll_lite.strategy.non_finite import NonFiniteStepsError

LOSSES = {
    "ppo+entropy": (
        ppo_policy_loss_func("seq-mean-token-mean", dual_clip_c=3.0, entropy_coef=0.05),
        ["response_mask"],
        "log_probs",
    ),
    "sequence": (sequence_policy_loss_func("seq-mean-token-sum-norm", seq_len_norm=20), ["response_mask"], "log_probs"),
    "ppo_kl": (kl_regularized_loss_func("token-mean", kl_coef=0.5), ["response_mask", "kl_mask"], "log_probs"),
    "value": (value_loss_func("seq-mean-token-sum", clip_range=0.5), ["response_mask"], "value"),
    "sft": (sft_loss_func(), ["response_mask"], "log_probs"),
}
PARTITIONS = {"padded": Partition(1, 2, False), "packed": Partition(2, 2, True)}
POISON = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=torch.float64)


def poisoned(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    garbage = POISON[torch.arange(values.numel()) % 3].reshape(values.shape)
    return torch.where(keep, values, garbage)


def poison_batch(data, mask_keys):
    """nan / +inf / -inf at every position outside the declared masks, in every float tensor;
    ref_log_probs also outside kl_mask alone (the KL term's own mask)."""
    outside = torch.zeros_like(data["response_mask"], dtype=torch.bool)
    for key in mask_keys:
        outside |= data[key].bool()
    bad = data.select(data.batch.keys(), data.non_tensor_batch.keys())
    for name in ("old_log_probs", "ref_log_probs", "advantages", "values", "returns"):
        bad.batch[name] = poisoned(data[name], outside)
    if "kl_mask" in mask_keys:
        bad.batch["ref_log_probs"] = poisoned(data["ref_log_probs"], data["kl_mask"].bool())
    return bad


def with_poisoned_output(loss_func, mask_keys):
    """The model's outputs (log-probs, entropy, values) turned to nan/inf outside the masks, still
    connected to the graph: a loss that reads them there gets a nan value or gradient."""

    def wrapped(batch, output):
        keep = torch.zeros_like(batch["response_mask"], dtype=torch.bool)
        for key in mask_keys:
            keep |= batch[key].bool()
        return loss_func(
            batch,
            {
                name: value + torch.where(keep, 0.0, poisoned(torch.zeros_like(value), keep))
                for name, value in output.items()
            },
        )

    return wrapped


@pytest.mark.parametrize("partition", PARTITIONS, ids=list(PARTITIONS))
@pytest.mark.parametrize("name", LOSSES)
def test_poison_outside_the_masks_gives_the_clean_step_bit_for_bit(name, partition):
    loss_func, mask_keys, head = LOSSES[name]
    data = random_rl_batch(num_rows=10, seq_len=20, mask_keys=mask_keys, seed=3)
    model = _model_with_head(build_causal_lm(TINY_MODEL, dtype=torch.float64, seed=0), head, seed=0)
    clean_loss, clean_grads = simulate_step(model, data, loss_func, PARTITIONS[partition])
    bad_loss, bad_grads = simulate_step(
        model, poison_batch(data, mask_keys), with_poisoned_output(loss_func, mask_keys), PARTITIONS[partition]
    )
    assert bad_loss == clean_loss
    assert clean_grads.keys() == bad_grads.keys()
    for key, grad in clean_grads.items():
        assert torch.equal(grad, bad_grads[key]), key


@pytest.fixture(scope="module")
def strategy():
    config = StrategyConfig(
        use_packing=True, grad_accum_steps=2, param_dtype="float64", lr=1e-3, max_consecutive_skipped_steps=2
    )
    return FSDP2Strategy(build_causal_lm(TINY_MODEL, dtype=torch.float64, seed=0), config)


def test_the_real_strategy_skips_nothing_on_a_batch_poisoned_outside_the_mask(strategy):
    data = random_rl_batch(num_rows=8, seq_len=16, seed=4)
    loss_func = ppo_policy_loss_func("token-mean")
    strategy.reset_optimizer(lr=0.0)  # both steps start from the same weights
    clean = strategy.train_step(data, loss_func)
    bad = strategy.train_step(poison_batch(data, ["response_mask"]), loss_func)
    strategy.reset_optimizer()
    assert bad["skipped_step"] == 0.0 and bad["grad_norm"] == clean["grad_norm"] and bad["loss"] == clean["loss"]


def test_nan_inside_the_mask_stops_the_run_after_max_consecutive_skipped_steps(strategy, caplog):
    data = random_rl_batch(num_rows=8, seq_len=16, seed=4)
    loss_func = ppo_policy_loss_func("token-mean")
    bad = data.select(data.batch.keys())
    bad.batch["advantages"] = torch.where(
        data["response_mask"].bool() & (torch.arange(16) == 5), float("nan"), data["advantages"]
    )
    assert strategy.train_step(bad, loss_func)["skipped_step"] == 1.0
    assert "'advantages' (" in caplog.text and "inside the loss masks" in caplog.text
    assert strategy.train_step(data, loss_func)["skipped_step"] == 0.0  # a good step resets the count
    assert strategy.train_step(bad, loss_func)["skipped_step"] == 1.0
    with pytest.raises(
        NonFiniteStepsError,
        match=r"2 in a row.*nan/inf in 'advantages' \(\d+ inside the loss masks, 0 outside\)"
        r".*max_consecutive_skipped_steps=2",
    ):
        strategy.train_step(bad, loss_func)


def test_the_stop_survives_pickling_and_names_the_config_key_with_its_section():
    import pickle

    error = pickle.loads(
        pickle.dumps(
            NonFiniteStepsError(float("nan"), 3, 1, "nan/inf in 'advantages' (2 inside the loss masks, 0 outside)")
        )
    )
    assert error.describe("critic.") == (
        "grad norm is nan, optimizer step skipped (3 in a row); rank 1: nan/inf in 'advantages' (2 inside the loss masks, "
        "0 outside); critic.max_consecutive_skipped_steps=3 reached (raise it, or null to never stop; lowering lr or "
        "fixing the data usually helps)"
    )


def test_max_consecutive_skipped_steps_is_validated():
    with pytest.raises(ValueError, match="actor.max_consecutive_skipped_steps: must be >= 1 or null"):
        StrategyConfig(max_consecutive_skipped_steps=0).validate("actor.")
    StrategyConfig(max_consecutive_skipped_steps=None).validate()
