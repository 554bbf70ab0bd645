"""Multi-turn batches: environment and tool tokens sit between the model's turns in a response, and
`loss_mask_keys` names the mask of the model's own tokens (model_mask). Every built-in loss that
reads that mask gives those positions exactly zero gradient, in every aggregation mode, whatever the
values the batch holds there. (The step over such batches equals the global-batch step for D ∈ {1, 2}
× A ∈ {1, 2, 3} × padded / packed: the multiturn_* cases of tests/test_exactness.py.)"""

import pytest
import torch
from loss_cases import MASK_KEYS, global_batch, make_loss

from roll_lite.data import DataProto
from roll_lite.loss import AGG_MODES

MULTI_TURN_LOSSES = [name for name in MASK_KEYS if name.startswith("multiturn_")]


def global_stats(batch, keys):
    return {
        "batch_num_tokens": {k: batch[k].sum().double() for k in keys},
        "global_valid_samples": {k: (batch[k].sum(-1) > 0).sum().double() for k in keys},
    }


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("name", MULTI_TURN_LOSSES)
def test_environment_tokens_get_exactly_zero_gradient(name, mode):
    data = global_batch(torch.float64)
    batch = dict(data.batch.items())
    model_mask = batch["model_mask"].bool()
    environment = batch["response_mask"].bool() & ~model_mask
    assert environment.sum() >= 5 and model_mask.sum() >= 5  # both kinds of token are there
    # values at the environment positions that would dominate the loss if they leaked into it
    for key in ("old_log_probs", "ref_log_probs", "advantages", "values", "returns", "rollout_log_probs"):
        batch[key] = torch.where(environment, torch.full_like(batch[key], 1e6), batch[key])
    inputs = {
        key: (0.1 * torch.randn(batch["input_ids"].shape, dtype=torch.float64) - 2.0).requires_grad_()
        for key in ("log_probs", "entropy", "values")
    }
    with torch.no_grad():
        inputs["log_probs"][environment] = 1e6
    loss, _ = make_loss(name, mode)(DataProto(batch, meta_info=global_stats(batch, MASK_KEYS[name])), inputs)
    assert torch.isfinite(loss)
    loss.backward()
    read = [inputs[key].grad for key in inputs if inputs[key].grad is not None]
    assert read, "the loss read none of its inputs"
    for grad in read:
        assert torch.equal(grad[environment], torch.zeros_like(grad[environment]))
        assert torch.equal(
            grad[~batch["attention_mask"].bool()], torch.zeros_like(grad[~batch["attention_mask"].bool()])
        )
    assert any(grad[model_mask].abs().sum() > 0 for grad in read)
