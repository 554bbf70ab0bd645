"""MoE exactness and router replay on tiny transformers MoE models (float64, eager experts).

- The load-balancing and z-losses (roll_lite/loss/aux.py) plus a token-mean policy term, computed per micro-batch
  from injected global expert counts and token count, sum over D × A micro-batches (padded or packed) to one
  forward/backward over the global batch: loss and every gradient, relative error ≤ 1e-10. The counts come from a
  no-grad counting forward at the step's weights, as the old-log-prob forward would give them. The D ranks are
  simulated in one process here (their gradients add as an all-reduce would); the strategy's gloo wiring is not
  built yet.
- Router replay (roll_lite/model/moe.py): replayed experts equal the recorded ones token by token, also after
  the weights moved, and for a packed batch; replaying a forward's own routing reproduces it bit for bit."""

import pytest
import torch

from roll_lite.loss.aux import expert_counts, load_balancing_loss, router_z_loss
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
AUX_COEF, Z_COEF = 0.5, 0.1


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


def step_loss(model, batch, rows, packed, counts, tokens, loss_tokens):
    out, record, loss_mask, counted, advantages = forward(model, batch, rows, packed)
    logits = record.router_logits()
    policy = -(advantages * out["log_probs"] * loss_mask).sum() / loss_tokens
    aux = load_balancing_loss(logits, counted, counts, tokens)
    return policy + AUX_COEF * aux + Z_COEF * router_z_loss(logits, counted, tokens)


def grads(model) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


@pytest.fixture(scope="module")
def reference():
    model, batch = tiny("qwen3_moe"), global_batch()
    rows = list(range(len(LENGTHS)))
    with torch.no_grad():
        _, record, _, counted, _ = forward(model, batch, rows, packed=False)
    counts = expert_counts(record.expert_ids(counted.shape), counted, 4)
    tokens, loss_tokens = float(counted.sum()), float(batch["loss_mask"].sum())
    loss = step_loss(model, batch, rows, False, counts, tokens, loss_tokens)
    loss.backward()
    return model, batch, counts, tokens, loss_tokens, loss.detach(), grads(model)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("ranks,accumulation", [(1, 1), (1, 2), (2, 1), (2, 2)])
def test_aux_losses_equal_global_batch(reference, ranks, accumulation, packed):
    model, batch, ref_counts, tokens, loss_tokens, ref_loss, ref_grads = reference
    model.zero_grad(set_to_none=True)
    parts = ranks * accumulation
    micro = [list(range(len(LENGTHS)))[i::parts] for i in range(parts)]
    counts = torch.zeros_like(ref_counts)
    with torch.no_grad():  # the counting pass: the old-log-prob forward, at the step's weights
        for rows in micro:
            _, record, _, counted, _ = forward(model, batch, rows, packed)
            counts += expert_counts(record.expert_ids(counted.shape), counted, 4)
    assert torch.equal(counts, ref_counts)
    total = 0.0
    for rows in micro:
        loss = step_loss(model, batch, rows, packed, counts, tokens, loss_tokens)
        loss.backward()
        total = total + loss.detach()
    assert abs(total - ref_loss) / abs(ref_loss) <= 1e-10
    assert (grads(model) - ref_grads).norm() / ref_grads.norm() <= 1e-10
    model.zero_grad(set_to_none=True)


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
