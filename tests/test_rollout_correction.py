"""The rollout engine's log-probs and truncated importance sampling (TIS) on them."""

import math

import pytest
import torch

from roll_lite.data import DataProto
from roll_lite.loss import agg_loss, ppo_clipped_loss, ppo_policy_loss_func, rollout_importance_weights
from roll_lite.loss.checker import TINY_MODEL
from roll_lite.modeling import build_causal_lm
from roll_lite.rollout import HFEngine, SamplingParams

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
    loss, metrics = ppo_policy_loss_func("token-mean", rollout_is="token", rollout_is_cap=1.5)(batch, {"log_probs": log_probs})
    masked = lambda t: torch.where(MASK.bool(), t, torch.zeros(()))  # noqa: E731
    loss_mat, _ = ppo_clipped_loss(masked(log_probs), masked(ACTOR), batch["advantages"])
    weights, _ = rollout_importance_weights(ACTOR, ENGINE, MASK, "token", cap=1.5)
    assert torch.allclose(loss, agg_loss(loss_mat * weights, MASK, "token-mean", batch_num_tokens=6, global_valid_samples=2))
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


@pytest.mark.parametrize("params", [SamplingParams(12, num_samples=3), SamplingParams(12, num_samples=2, temperature=0.7, top_k=5, top_p=0.9)])
def test_the_hf_engine_returns_the_log_prob_of_every_sampled_token(params):
    """Against a teacher-forced forward of the same model: log softmax(logits / T) at each sampled
    token, before top-k / top-p. The model's generation_config asks for a repetition penalty, which
    a model folder can do: the engine must not apply it."""
    torch.manual_seed(0)
    model = build_causal_lm(dict(TINY_MODEL, vocab_size=40), seed=1)
    model.generation_config.repetition_penalty = 3.0
    engine = HFEngine(model, pad_token_id=0, eos_token_id=1, seed=3)
    prompts = [[5, 6, 7], [8, 9]]
    out = engine.generate(prompts, params)
    assert len(out.token_ids) == len(out.log_probs) == len(prompts) * params.num_samples
    assert any(ids[-1] != 1 for ids in out.token_ids)  # rows that ran to max_new_tokens
    if params.temperature == 1.0:
        assert any(len(ids) < 12 for ids in out.token_ids)  # and rows that stopped at EOS, padded by transformers
        # a sampled token that happens to be the pad id stays: it is part of what was sampled (and scored below)
        assert any(0 in ids and len(ids) == 12 for ids in out.token_ids)
    for row, (ids, log_probs) in enumerate(zip(out.token_ids, out.log_probs)):
        prompt = prompts[row // params.num_samples]
        sequence = torch.tensor([prompt + ids])
        with torch.no_grad():
            logits = model(input_ids=sequence).logits[0, len(prompt) - 1 : -1].float()
        expected = torch.log_softmax(logits / params.temperature, -1).gather(1, torch.tensor(ids)[:, None]).squeeze(1)
        assert len(log_probs) == len(ids)
        assert torch.allclose(torch.tensor(log_probs), expected, atol=1e-5), row


def test_shared_weights_are_bound_again_only_when_they_are_other_tensors():
    model = build_causal_lm(dict(TINY_MODEL, vocab_size=40), seed=1)
    engine = HFEngine(build_causal_lm(dict(TINY_MODEL, vocab_size=40), seed=2), pad_token_id=0, eos_token_id=1)
    own = {name: p.detach() for name, p in model.state_dict().items()}
    engine.share_weights(own)
    bound = dict(engine.model.named_parameters())
    engine.share_weights({name: t for name, t in model.state_dict().items()})  # the same tensors again: nothing to do
    assert all(p is bound[name] for name, p in engine.model.named_parameters())
    with torch.no_grad():  # an in-place update (the optimizer's) shows in the engine
        model.model.norm.weight.add_(1.0)
    assert torch.equal(engine.model.model.norm.weight, model.model.norm.weight)
    other = {name: t.clone() for name, t in own.items()}
    engine.share_weights(other)
    assert engine.model.model.norm.weight.data_ptr() == other["model.norm.weight"].data_ptr()


def test_greedy_decoding_returns_no_log_probs():
    model = build_causal_lm(dict(TINY_MODEL, vocab_size=40), seed=1)
    out = HFEngine(model, pad_token_id=0, eos_token_id=1).generate([[5, 6]], SamplingParams(4, greedy=True))
    assert out.log_probs is None and len(out.token_ids) == 1


def test_a_loss_func_of_ones_own_that_ignores_tis_stops_the_run():
    from roll_lite.config import ConfigError, load_config
    from roll_lite.pipelines.ppo import PPOPipeline

    class PlainPolicyGradient(PPOPipeline):
        def loss_func(self, batch, output):  # never looks at batch["rollout_log_probs"]
            return ppo_policy_loss_func()(batch, output)

    config = load_config(None, ["algorithm.rollout_is=token"])
    PPOPipeline(config).check_rollout_is_applied({"rollout_is_weight": 1.0, "pg_loss": 0.1})  # the built-in loss applies them
    with pytest.raises(ConfigError, match="algorithm.rollout_is=token: PlainPolicyGradient.loss_func applied no importance"):
        PlainPolicyGradient(config).check_rollout_is_applied({"pg_loss": 0.1})
    PlainPolicyGradient(load_config(None, [])).check_rollout_is_applied({"pg_loss": 0.1})  # not asked for: fine
