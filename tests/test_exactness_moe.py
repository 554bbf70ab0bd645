"""MoE exactness and router replay on tiny transformers MoE models (float64, eager experts).

- The MoE rows of the exactness matrix (moe_cases.py): a tiny Qwen3-MoE trained by the real FSDP2 strategy in
  D ∈ {1, 2} gloo processes × A ∈ {1, 2} × padded / packed, and token-budget micro-batches (at D = 2 the ranks
  run 2 and 1: the counting forward makes placeholder passes too), with the PPO + KL loss plus the load-balancing
  and z-losses (roll_lite/loss/aux.py) from the step's global expert counts, which the strategy counts in a
  no-grad forward and injects into every micro-batch (roll_lite/strategy/moe_stats.py): loss, aux metrics and
  every gradient equal one forward/backward over the global batch, relative error ≤ 1e-10. The same losses from
  each micro-batch's own counts (the naive way) miss it.
- Router replay (roll_lite/model/moe.py): replayed experts equal the recorded ones token by token, also after
  the weights moved, and for a packed batch; replaying a forward's own routing reproduces it bit for bit."""

import pytest
import torch
from moe_cases import MoeCase, moe_reference, run_moe_strategy

from roll_lite.loss.aux import load_balancing_loss, router_z_loss
from roll_lite.loss.checker import relative_deviation
from roll_lite.model.modeling import CausalLMWithLogProbs, build_causal_lm
from roll_lite.model.moe import moe_routers, routing
from roll_lite.model.packing import pack_rows

COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2)
COMMON.update(num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2)
MODELS = {
    "qwen3_moe": dict(model_type="qwen3_moe", head_dim=8, norm_topk_prob=True, **COMMON),
    "qwen2_moe": dict(model_type="qwen2_moe", shared_expert_intermediate_size=16, norm_topk_prob=False, **COMMON),
}
LENGTHS = [9, 6, 4, 8, 3, 7, 5, 9]
PROMPT = 2


def tiny(name: str, seed: int = 0) -> CausalLMWithLogProbs:
    model = CausalLMWithLogProbs(build_causal_lm(MODELS[name], dtype=torch.float64, seed=seed))
    with torch.no_grad():  # transformers initialises routers to zero: give them a routing worth testing
        for router in moe_routers(model):
            router.weight.normal_(0, 1.0)
    return model


def global_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    rows, width = len(LENGTHS), max(LENGTHS)
    attention = torch.tensor([[1] * n + [0] * (width - n) for n in LENGTHS])
    loss_mask = attention.clone()
    loss_mask[:, : PROMPT - 1] = 0
    loss_mask[torch.arange(rows), torch.tensor(LENGTHS) - 1] = 0  # the last token predicts nothing
    return dict(
        input_ids=torch.randint(0, 64, (rows, width), generator=generator) * attention,
        attention_mask=attention,
        loss_mask=loss_mask,
        advantages=torch.randn(rows, 1, generator=generator, dtype=torch.float64).expand(rows, width),
    )


def forward(model, batch, rows: list[int], packed: bool, replay=None):
    """(outputs, routing, loss mask, counted mask, advantages), all in the forward's token layout."""
    ids, attention = batch["input_ids"][rows], batch["attention_mask"][rows]
    lengths = [LENGTHS[r] for r in rows]
    width = max(lengths)
    ids, attention = ids[:, :width], attention[:, :width]
    extra = [batch["loss_mask"][rows][:, :width], attention, batch["advantages"][rows][:, :width]]
    if packed:
        pack = pack_rows(ids, lengths)
        extra = [torch.cat([t[i, :n] for i, n in enumerate(lengths)])[None] for t in extra]
        with routing(model, replay) as record:
            out = model(pack.input_ids, pack.position_ids, None, pack.cu_seqlens, pack.max_seqlen)
    else:
        positions = (attention.cumsum(1) - 1).clamp(min=0)
        with routing(model, replay) as record:
            out = model(ids, positions, attention)
    return (out, record, *extra)


CASES = [MoeCase(d, a, packed) for d in (1, 2) for a in (1, 2) for packed in (False, True)]
CASES += [MoeCase(d, 1, True, budget=True) for d in (1, 2)]
NAIVE = [MoeCase(2, 2, False, naive=True), MoeCase(1, 2, True, naive=True)]
LORA_CASES = [
    MoeCase(1, 2, False, lora=True),
    MoeCase(2, 2, True, lora=True),
    MoeCase(2, 1, True, budget=True, lora=True),
]


@pytest.fixture(scope="module")
def strategy_results():
    return run_moe_strategy(CASES + NAIVE + LORA_CASES)


@pytest.fixture(scope="module")
def global_reference():
    return moe_reference()


def errors(result, ref) -> tuple[float, float]:
    (loss, grads, _), (ref_loss, ref_grads, _) = result, ref
    assert set(grads) == set(ref_grads), set(grads) ^ set(ref_grads)
    return relative_deviation(loss, ref_loss), max(relative_deviation(grads[n], ref_grads[n]) for n in ref_grads)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_aux_losses_equal_global_batch(case, strategy_results, global_reference):
    loss_error, grad_error = errors(strategy_results[case], global_reference)
    assert loss_error <= 1e-10 and grad_error <= 1e-10, (loss_error, grad_error)
    metrics, aux = strategy_results[case][2], global_reference[2]
    if case.budget and case.world_size == 2:  # the ranks' shares need 2 and 1 micro-batches (test_exactness.py)
        assert metrics["num_micro_batches"] == 2
    assert all(relative_deviation(metrics[name], value) <= 1e-10 for name, value in aux.items()), (metrics, aux)


@pytest.mark.parametrize("case", LORA_CASES, ids=[c.id for c in LORA_CASES])
def test_lora_on_attention_and_experts_equals_peft_global_batch(case, strategy_results):
    """Only the adapters get gradients (attention's and each layer's two expert weights', frozen base); they and the
    loss equal one forward/backward of peft's model over the global batch."""
    reference = moe_reference(lora=True)
    loss_error, grad_error = errors(strategy_results[case], reference)
    assert loss_error <= 1e-10 and grad_error <= 1e-10, (loss_error, grad_error)
    grads = strategy_results[case][1]
    assert all(".lora_" in name for name in grads)
    assert sum("experts" in name for name in grads) == 2 * 2 * MODELS["qwen3_moe"]["num_hidden_layers"]


@pytest.mark.parametrize("case", NAIVE, ids=[c.id for c in NAIVE])
def test_per_micro_batch_aux_losses_do_not(case, strategy_results, global_reference):
    """The check can fail: aux losses from each micro-batch's own counts miss the global batch's."""
    loss_error, grad_error = errors(strategy_results[case], global_reference)
    assert loss_error > 1e-6 and grad_error > 1e-6, (loss_error, grad_error)


def test_balanced_router_scores_one():
    logits = torch.zeros(1, 8, 4, dtype=torch.float64)
    counts = torch.full((1, 4), 4.0, dtype=torch.float64)  # 8 tokens × top-2, spread evenly
    mask = torch.ones(8)
    assert load_balancing_loss(logits, mask, counts, 8.0).item() == pytest.approx(1.0, abs=1e-15)
    assert router_z_loss(logits, mask, 8.0).item() == pytest.approx(torch.log(torch.tensor(4.0)).item() ** 2)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_replayed_experts_equal_recorded(name):
    engine, trainer = tiny(name, seed=0), tiny(name, seed=0)
    with torch.no_grad():  # the trainer's weights moved: its own routing now differs from the engine's
        for router in moe_routers(trainer):
            router.weight.add_(torch.randn_like(router.weight))
    batch, rows = global_batch(1), list(range(len(LENGTHS)))
    with torch.no_grad():
        engine_out, recorded, _, counted, _ = forward(engine, batch, rows, packed=False)
        own_out, own, *_ = forward(engine, batch, rows, packed=False, replay=recorded.expert_ids(counted.shape))
        _, drifted, *_ = forward(trainer, batch, rows, packed=False)
    experts = recorded.expert_ids(counted.shape)
    assert torch.equal(own_out["log_probs"], engine_out["log_probs"])
    valid = counted.bool()
    assert not torch.equal(drifted.expert_ids(counted.shape)[valid], experts[valid])
    for packed in (False, True):
        replay = torch.cat([experts[i, :n] for i, n in enumerate(LENGTHS)])[None] if packed else experts
        out, replayed, _, counted_here, _ = forward(trainer, batch, rows, packed, replay=replay)
        assert torch.equal(replayed.expert_ids(counted_here.shape), replay)
        out["log_probs"].sum().backward()
        assert all(router.weight.grad.abs().sum() > 0 for router in moe_routers(trainer))
        trainer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("key", ["moe_aux_loss_coef", "moe_z_loss_coef"])
def test_coefficients_are_checked(key):
    from roll_lite.config import ConfigError, load_config
    from roll_lite.strategy import StrategyConfig

    StrategyConfig(**{key: 0.0}).validate("actor.")
    for bad in (-0.1, float("nan")):
        with pytest.raises(ValueError, match=f"actor.{key}: must be >= 0"):
            StrategyConfig(**{key: bad}).validate("actor.")
    with pytest.raises(ConfigError, match=f"actor.{key}: model.model_type=qwen2 is a dense architecture"):
        load_config(None, [f"actor.{key}=0.1"])
    with pytest.raises(ConfigError, match=f"critic.{key}: the MoE auxiliary losses are the actor's"):
        load_config(None, ["model.model_type=qwen3_moe", f"critic.{key}=0.1"])
    assert getattr(load_config(None, ["model.model_type=qwen3_moe", f"actor.{key}=0.1"]).actor, key) == 0.1
