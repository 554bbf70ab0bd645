"""A fresh optimizer after a forward-only pass (the SFT pipeline's step-0 eval, then
reset_optimizer(sft.lr)) must train every parameter: FSDP2 leaves the root module unsharded after
a no_grad forward, and an optimizer built then held transient copies of the embeddings and the
final norm, which never trained (the loss stalled at ~3.5 nats on the byo example)."""

import torch

from roll_lite.loss import sft_loss_func
from roll_lite.loss.checker import TINY_MODEL, random_rl_batch
from roll_lite.model.modeling import build_causal_lm
from roll_lite.strategy import FSDP2Strategy, StrategyConfig


def trained_state(forward_first: bool) -> dict[str, torch.Tensor]:
    strategy = FSDP2Strategy(
        build_causal_lm(TINY_MODEL, dtype=torch.float64, seed=0), StrategyConfig(param_dtype="float64", lr=1e-3)
    )
    data = random_rl_batch(num_rows=6, seq_len=10, seed=1)
    data.meta_info["loss_mask_keys"] = ["response_mask"]
    if forward_first:
        strategy.compute_log_probs(data)
    strategy.reset_optimizer(1e-2)
    for _ in range(2):
        strategy.train_step(data, sft_loss_func("response_mask"))
    return strategy.full_state_dict()


def test_reset_optimizer_after_compute_log_probs_trains_every_parameter():
    initial = build_causal_lm(TINY_MODEL, dtype=torch.float64, seed=0).state_dict()
    plain, after_forward = trained_state(False), trained_state(True)
    for name, value in plain.items():
        assert not torch.equal(value, initial[name]), name  # every tensor trains
        torch.testing.assert_close(after_forward[name], value, rtol=1e-12, atol=1e-14, msg=name)
