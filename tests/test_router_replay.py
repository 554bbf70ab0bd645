"""Router replay from the hf engine: the engine records each token's experts per MoE layer
(Completions.routed_experts); the trainer's forward replays them (roll_lite/model/moe.py).

The engine (float32) is made to route differently from the trainer (float64, the same weights), as a different
kernel would near a tie: a hook on its routers moves every other token's first expert. Without replay the
trainer's log-probs then miss the engine's; with replay the experts equal the recorded ones token by token, and
the gap falls to the float32 / float64 noise of a dense model."""

import copy

import torch

from roll_lite.model.modeling import CausalLMWithLogProbs, build_causal_lm
from roll_lite.model.moe import GenerationRouting, moe_routers, replayed_weights, routing
from roll_lite.rollout.engine import SamplingParams
from roll_lite.rollout.hf import HFEngine

MODEL = dict(model_type="qwen3_moe", vocab_size=48, hidden_size=32, intermediate_size=64, moe_intermediate_size=16)
MODEL.update(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4)
MODEL.update(num_experts_per_tok=2, norm_topk_prob=True)
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]


def other_kernel(router, _inputs, output):
    logits, weights, experts = output
    moved = experts.clone()
    moved[::2, 0] = (experts[::2, 1] + 1 + torch.arange(len(experts[::2])) % 2) % 4
    clash = moved[:, 0] == moved[:, 1]
    moved[clash, 0] = (moved[clash, 0] + 1) % 4
    return logits, replayed_weights(router, logits, moved, weights.dtype), moved


def engine_and_trainer():
    lm = build_causal_lm(MODEL, dtype=torch.float64, seed=0)
    with torch.no_grad():
        for router in moe_routers(lm):
            router.weight.normal_(0, 1.0)
    trainer = CausalLMWithLogProbs(copy.deepcopy(lm))
    engine_lm = copy.deepcopy(lm).to(torch.float32)
    engine_lm.set_experts_implementation("eager")
    return HFEngine(engine_lm, pad_token_id=0, eos_token_id=1, seed=3, record_experts=GenerationRouting), trainer


def trainer_forward(trainer, prompts, completions, replay: bool):
    """Per row (prompt + response): the trainer's log-probs of the response tokens and its experts."""
    copies = len(completions.token_ids) // len(prompts)
    rows = [prompts[i // copies] + tokens for i, tokens in enumerate(completions.token_ids)]
    width = max(map(len, rows))
    ids = torch.tensor([row + [0] * (width - len(row)) for row in rows])
    attention = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    recorded = None
    if replay:
        recorded = torch.full((len(rows), width, 2, 2), -1, dtype=torch.long)
        for i, experts in enumerate(completions.routed_experts):
            recorded[i, : len(experts)] = experts
    with torch.no_grad(), routing(trainer, replay=recorded) as record:
        out = trainer(ids, (attention.cumsum(1) - 1).clamp(min=0), attention)
    experts = record.expert_ids(ids.shape)
    log_probs, routed = [], []
    for i, row in enumerate(rows):
        start = len(prompts[i // copies])
        log_probs.append(out["log_probs"][i, start - 1 : len(row) - 1])
        routed.append(experts[i, : len(row)])
    return log_probs, routed


def test_replay_matches_engine_routing_and_log_probs():
    engine, trainer = engine_and_trainer()
    handles = [router.register_forward_hook(other_kernel) for router in moe_routers(engine.model)]
    completions = engine.generate(PROMPTS, SamplingParams(max_new_tokens=6, num_samples=2))
    for handle in handles:
        handle.remove()
    assert len(completions.routed_experts) == len(completions.token_ids)
    gaps = {}
    for replay in (False, True):
        log_probs, routed = trainer_forward(trainer, PROMPTS, completions, replay)
        pairs = zip(log_probs, completions.log_probs)
        gap = max((a - torch.tensor(b, dtype=a.dtype)).abs().max().item() for a, b in pairs)
        gaps[replay] = gap
        same = [torch.equal(r[e >= 0], e[e >= 0]) for r, e in zip(routed, completions.routed_experts)]
        assert all(same) == replay
    assert gaps[True] <= 1e-5 and gaps[False] >= 1e3 * gaps[True], gaps  # float32 noise vs routing drift


def test_recorded_routing_is_the_engines_own():
    """Without interference, the engine's recorded experts are the trainer's own routing at the same weights."""
    engine, trainer = engine_and_trainer()
    completions = engine.generate(PROMPTS, SamplingParams(max_new_tokens=5, greedy=True))
    _, routed = trainer_forward(trainer, PROMPTS, completions, replay=False)
    for own, recorded, prompt, tokens in zip(routed, completions.routed_experts, PROMPTS, completions.token_ids):
        assert recorded.shape == (len(prompt) + len(tokens), 2, 2)
        assert (recorded[:-1] >= 0).all()
        known = recorded >= 0
        assert torch.equal(own[known], recorded[known])


def recorded_batch():
    """(the float64 trainer's lm, a batch of an engine made to route otherwise: tokens, its log-probs, and its
    experts as the pipelines carry them, `routed_experts`)."""
    from roll_lite.data.sequences import build_sequence_batch, token_aligned_experts

    engine, trainer = engine_and_trainer()
    handles = [router.register_forward_hook(other_kernel) for router in moe_routers(engine.model)]
    completions = engine.generate(PROMPTS, SamplingParams(max_new_tokens=6, num_samples=2))
    for handle in handles:
        handle.remove()
    prompts = [prompt for prompt in PROMPTS for _ in range(2)]
    batch = build_sequence_batch(prompts, completions.token_ids, 0, completions.log_probs)
    batch.batch["routed_experts"] = token_aligned_experts(batch["attention_mask"], completions.routed_experts)
    return trainer.lm, batch


def test_the_strategy_replays_the_batchs_routing_padded_packed_and_in_training():
    """FSDP2Strategy with router_replay: its log-prob forwards (padded and packed, in micro-batches) use the
    recorded experts of every token, the engine's log-probs then match; compare mode shows the drift instead; a
    training step reports the sums of the same columns."""
    from roll_lite.strategy import FSDP2Strategy, StrategyConfig

    lm, batch = recorded_batch()
    response, known = batch["response_mask"].bool(), (batch["routed_experts"] >= 0).all(-1).sum()
    gaps = {}
    for mode, packed in (("rollout", False), ("rollout", True), ("compare", True)):
        config = StrategyConfig(use_packing=packed, grad_accum_steps=2, param_dtype="float64", router_replay=mode)
        strategy = FSDP2Strategy(copy.deepcopy(lm), config)
        out = strategy.compute_log_probs(batch)
        assert out["routing_known"].sum() == known
        assert out["routing_own_differs"].sum() > 0  # the engine did route otherwise
        replayed = out["routing_differs"].sum()
        assert replayed == 0 if mode == "rollout" else replayed == out["routing_own_differs"].sum()
        gaps[mode, packed] = (out["log_probs"] - batch["rollout_log_probs"].double())[response].abs().max().item()
    assert gaps["rollout", False] <= 1e-5 and gaps["rollout", True] <= 1e-5, gaps
    assert gaps["compare", True] >= 1e3 * gaps["rollout", True], gaps

    def loss_func(data, output):
        mask = data["response_mask"]
        return -(output["log_probs"] * mask).sum() / data.meta_info["batch_num_tokens"]["response_mask"], {}

    batch.meta_info["loss_mask_keys"] = ["response_mask"]
    config = StrategyConfig(use_packing=True, grad_accum_steps=2, param_dtype="float64", router_replay="rollout")
    metrics = FSDP2Strategy(copy.deepcopy(lm), config).train_step(batch, loss_func)
    assert metrics["moe_routing/known"] == known and metrics["moe_routing/differs"] == 0
    assert metrics["moe_routing/own_differs"] > 0


def test_router_replay_old_records_the_trainers_routing_and_its_training_forwards_replay_it():
    """R2 (router_replay=old), the fallback of any engine that records no routing (vLLM's): the no-grad log-prob
    pass of a batch without `routed_experts` returns the experts the trainer's routers chose, token by token (padded
    and packed); replayed, the step's training forwards use them, also after an update moved the routers."""
    from pipelines.moe_routing import take_own_routing
    from roll_lite.data import DataProto
    from roll_lite.strategy import FSDP2Strategy, StrategyConfig

    lm, recorded = recorded_batch()
    batch = DataProto({name: t for name, t in recorded.batch.items() if name != "routed_experts"})
    real = batch["attention_mask"].bool()
    with torch.no_grad(), routing(lm) as record:
        lm(
            batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=(batch["attention_mask"].cumsum(1) - 1).clamp(min=0),
        )
    own = record.expert_ids(batch["input_ids"].shape)
    for packed in (False, True):
        config = StrategyConfig(use_packing=packed, grad_accum_steps=2, param_dtype="float64", router_replay="old")
        out = FSDP2Strategy(copy.deepcopy(lm), config).compute_log_probs(batch)
        assert "routing_known" not in out.batch  # nothing recorded to compare with yet
        trained = DataProto(dict(batch.batch))
        take_own_routing(trained, out)
        assert trained["routed_experts"].dtype == torch.int16
        assert torch.equal(trained["routed_experts"][real].long(), own[real].long())
        assert (trained["routed_experts"][~real] == -1).all()

    def loss_func(data, output):
        mask = data["response_mask"]
        return -(output["log_probs"] * mask).sum() / data.meta_info["batch_num_tokens"]["response_mask"], {}

    trained.meta_info["loss_mask_keys"] = ["response_mask"]
    config = StrategyConfig(use_packing=True, grad_accum_steps=2, param_dtype="float64", router_replay="old", lr=0.5)
    strategy = FSDP2Strategy(copy.deepcopy(lm), config)
    first, second = strategy.train_step(trained, loss_func), strategy.train_step(trained, loss_func)
    layers = 2
    assert first["moe_routing/known"] == second["moe_routing/known"] == real.sum() * layers
    assert first["moe_routing/differs"] == second["moe_routing/differs"] == 0
    assert first["moe_routing/own_differs"] == 0  # the weights it was recorded at
    assert second["moe_routing/own_differs"] > 0  # an update later the routers choose otherwise: replay holds them
