"""The pair losses (roll_lite/loss/preference.py) against their formulas written out pair by pair in
plain Python (TRL 1.16's definitions: DPOTrainer's sigmoid and IPO on mean log-probs, CPOTrainer's SimPO
with γ and conservative smoothing; DPO's cDPO smoothing as TRL's sigmoid had it up to 0.28; the chosen
side's NLL); their metrics with TRL 1.16's formulas (under ipo of the summed log-probs, as DPOTrainer
logs them, not of the means the loss compares); the score head and its export as a transformers
sequence classifier that gives the trained scores. Exactness over D, A and packing: test_exactness.py."""

import math

import pytest
import torch

from roll_lite.data import DataProto
from roll_lite.loss import bradley_terry_loss_func, dpo_loss_func, local_mask_stats
from roll_lite.loss.checker import TINY_MODEL
from roll_lite.model.modeling import CausalLMWithScoreHead, build_causal_lm, sequence_classifier_state
from roll_lite.strategy.config import StrategyConfig
from roll_lite.strategy.micro_batches import forward_micro_batch


def logsigmoid(x):
    return -math.log1p(math.exp(-x))


def pair_batch():
    # 2 pairs; responses of 2, 3, 1, 2 tokens after a 1-token prompt
    chosen = torch.tensor([[0, 1, 1, 0], [0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]])
    rejected = torch.tensor([[0, 0, 0, 0], [0, 1, 1, 1], [0, 0, 0, 0], [0, 1, 1, 0]])
    log_probs = torch.tensor(
        [[0.0, -1.0, -2.0, 0.0], [0.0, -0.5, -1.5, -1.0], [0.0, -3.0, 0.0, 0.0], [0.0, -0.2, -0.1, 0.0]],
        dtype=torch.float64,
        requires_grad=True,
    )
    meta = {name: {"chosen_mask": value} for name, value in local_mask_stats(chosen).items()}
    batch = DataProto(
        {
            "chosen_mask": chosen,
            "rejected_mask": rejected,
            "reference_logps": torch.tensor([-2.5, -3.5, -2.0, -0.5], dtype=torch.float64),
        },
        meta_info=meta,
    )
    return batch, log_probs


SUMS = [(-3.0, -3.0), (-3.0, -0.3)]  # (chosen, rejected) summed log-probs per pair
LENGTHS = [(2, 3), (1, 2)]
REFERENCE = [(-2.5, -3.5), (-2.0, -0.5)]


@pytest.mark.parametrize(
    "loss_type, beta, smoothing, gamma",
    [("dpo", 0.5, 0.0, 0.0), ("dpo", 0.5, 0.2, 0.0), ("ipo", 0.5, 0.0, 0.0), ("simpo", 2.0, 0.1, 0.4)],
)
def test_dpo_family_equals_the_formulas(loss_type, beta, smoothing, gamma):
    batch, log_probs = pair_batch()
    loss, metrics = dpo_loss_func(loss_type, beta, smoothing, nll_coef=0.0, simpo_gamma=gamma)(
        batch, {"log_probs": log_probs}
    )
    expected, shown = [], {name: [] for name in ("chosen", "rejected", "accuracies", "margins", "logps_c", "logps_r")}
    for (pc, pr), (lc, lr), (rc, rr) in zip(SUMS, LENGTHS, REFERENCE):
        if loss_type == "simpo":
            rc = rr = 0.0
        # TRL 1.16's metrics: DPOTrainer's (dpo, ipo) of the summed log-probs, CPOTrainer's (simpo) of the means
        shown_c, shown_r = (pc / lc, pr / lr) if loss_type == "simpo" else (pc, pr)
        reward_c, reward_r = beta * (shown_c - rc), beta * (shown_r - rr)
        for name, value in zip(
            shown, (reward_c, reward_r, float(reward_c > reward_r), reward_c - reward_r, shown_c, shown_r)
        ):
            shown[name].append(value)
        if loss_type in ("ipo", "simpo"):
            pc, pr, rc, rr = pc / lc, pr / lr, rc / lc, rr / lr
        h = (pc - rc) - (pr - rr)
        if loss_type == "ipo":
            expected.append((h - 1 / (2 * beta)) ** 2)
        else:
            x = beta * h - gamma
            expected.append(-(1 - smoothing) * logsigmoid(x) - smoothing * logsigmoid(-x))
    assert loss.item() == pytest.approx(sum(expected) / 2, rel=1e-12)
    for name, metric in [
        ("chosen", "rewards/chosen"),
        ("rejected", "rewards/rejected"),
        ("accuracies", "rewards/accuracies"),
        ("margins", "rewards/margins"),
        ("logps_c", "logps/chosen"),
        ("logps_r", "logps/rejected"),
    ]:
        assert metrics[f"{metric}@sum"].item() == pytest.approx(sum(shown[name]) / 2, rel=1e-12, abs=1e-15), metric
    loss.backward()
    assert log_probs.grad[batch["chosen_mask"].bool() | batch["rejected_mask"].bool()].abs().min() > 0
    assert log_probs.grad[~(batch["chosen_mask"].bool() | batch["rejected_mask"].bool())].abs().max() == 0


def test_nll_term_is_the_chosen_token_mean():
    batch, log_probs = pair_batch()
    plain, _ = dpo_loss_func("dpo", 0.5)(batch, {"log_probs": log_probs})
    with_nll, metrics = dpo_loss_func("dpo", 0.5, nll_coef=0.3)(batch, {"log_probs": log_probs})
    nll = (1.0 + 2.0 + 3.0) / 3  # the chosen tokens' −log-probs over the 3 chosen tokens
    assert metrics["nll_loss@sum"].item() == pytest.approx(nll) and (with_nll - plain).item() == pytest.approx(
        0.3 * nll
    )


def test_bradley_terry_equals_the_formula_with_margin_and_centering():
    score_mask = torch.tensor([[0, 0, 1], [0, 1, 0], [0, 0, 1], [0, 0, 1]])
    chosen = torch.tensor([[0, 1, 1], [0, 0, 0], [0, 1, 1], [0, 0, 0]])
    rejected = torch.tensor([[0, 0, 0], [0, 1, 0], [0, 0, 0], [0, 1, 1]])
    scores = torch.tensor([[9.0, 9.0, 1.5], [9.0, 0.5, 9.0], [9.0, 9.0, -1.0], [9.0, 9.0, 0.25]], dtype=torch.float64)
    meta = {name: {"chosen_mask": value} for name, value in local_mask_stats(chosen).items()}
    batch = DataProto(
        {
            "chosen_mask": chosen,
            "rejected_mask": rejected,
            "score_mask": score_mask,
            "margin": torch.tensor([0.3, 0.3, 0.0, 0.0], dtype=torch.float64),
        },
        meta_info=meta,
    )
    loss, metrics = bradley_terry_loss_func(center_coef=0.1)(batch, {"scores": scores})
    pairs = [(1.5, 0.5, 0.3), (-1.0, 0.25, 0.0)]
    expected = sum(-logsigmoid(c - r - m) + 0.1 * (c + r) ** 2 for c, r, m in pairs) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert metrics["accuracy@sum"].item() == 0.5 and metrics["score_gap@sum"].item() == pytest.approx((1.0 - 1.25) / 2)


def test_a_micro_batch_whose_pairs_are_split_is_refused():
    batch, log_probs = pair_batch()
    with pytest.raises(ValueError, match="two consecutive rows, chosen then rejected"):
        dpo_loss_func("dpo")(batch.index_select([1, 0, 2, 3]), {"log_probs": log_probs})


@pytest.mark.parametrize("use_packing", [False, True], ids=["padded", "packed"])
def test_score_head_scores_equal_the_exported_sequence_classifier(use_packing):
    torch.manual_seed(0)
    lm = build_causal_lm(TINY_MODEL, dtype=torch.float64, seed=0)
    model = CausalLMWithScoreHead(lm, seed=3)
    with torch.no_grad():
        model.score.weight.mul_(20)  # scores of about unit size
    input_ids = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 2, 0, 0], [1, 9, 9, 9, 0]])
    attention = (torch.arange(5)[None] < torch.tensor([[5], [3], [4]])).long()
    batch = DataProto({"input_ids": input_ids, "attention_mask": attention})
    scores = forward_micro_batch(model, batch, StrategyConfig(use_packing=use_packing), with_entropy=False)["scores"]
    state = {name.removeprefix("lm."): value for name, value in model.state_dict().items()}
    classifier, weights = sequence_classifier_state(lm, state)
    classifier.load_state_dict(weights)
    classifier.config.pad_token_id = 0
    exported = classifier(input_ids=input_ids, attention_mask=attention).logits[:, 0]
    last = attention.sum(-1) - 1
    trained = scores[torch.arange(3), last]
    assert torch.allclose(trained, exported, rtol=1e-12, atol=1e-12) and trained.abs().min() > 1e-3
