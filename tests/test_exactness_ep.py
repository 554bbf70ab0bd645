"""The expert-parallel rows of the exactness matrix (roll_lite/strategy/expert_parallel.py), float64, gloo.

The MoE rows' tiny Qwen3-MoE (4 experts, top-2; moe_cases.py) trained by the real FSDP2 strategy with each rank
holding 4 / EP experts, tokens dispatched to their experts' owners by all-to-all: EP = 2 on 2 ranks and EP ∈ {2, 4}
on 4 ranks (at EP = 2 on 4 ranks two ranks own each expert: FSDP2 shards it over them), × A × padded / packed, with
the PPO + KL loss and the load-balancing and z-losses. Loss, aux metrics, grad norm and every gradient (the experts
gathered whole from their owners) equal one forward/backward of the plain HF model over the global batch, relative
error ≤ 1e-10, as the EP = 1 rows (test_exactness_moe.py). The check can fail: a combine that returns the experts'
outputs without undoing the sort by expert (the dispatch order) misses it. And the trl#5713 failure mode: the
log-probs and entropies at EP = 2 equal EP = 1's token by token; full_state_dict gathers every expert back whole; a
checkpoint written at EP = 2 resumes at EP = 2 and at EP = 1."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import pytest
import torch
from loss_cases import BUDGET, MASK_KEYS, global_batch
from moe_cases import LOSS, MoeCase, case_loss, moe_lm, moe_reference
from spawned_ranks import join_group, leave_group, spawn_ranks

from roll_lite.loss.checker import relative_deviation


@dataclass(frozen=True)
class EpCase:
    world_size: int
    ep: int
    grad_accum_steps: int
    packed: bool
    budget: bool = False  # token-budget micro-batches (packed): at D = 2 the ranks run 2 and 1 (a placeholder pass)
    miscombine: bool = False  # the negative control: expert outputs not put back in (token, slot) order

    @property
    def id(self) -> str:
        layout = "budget" if self.budget else f"A{self.grad_accum_steps}-{'packed' if self.packed else 'padded'}"
        return f"D{self.world_size}-EP{self.ep}-{layout}" + ("-miscombine" if self.miscombine else "")


CASES = [EpCase(2, 2, a, packed) for a in (1, 2) for packed in (False, True)] + [EpCase(2, 2, 1, True, budget=True)]
CASES += [EpCase(4, ep, a, packed) for ep in (2, 4) for a, packed in ((1, False), (2, True))]
WRONG = [EpCase(2, 2, 1, False, miscombine=True)]


def _whole_gradients(strategy) -> dict[str, torch.Tensor]:
    """{HF name: whole gradient}: DTensor shards made whole on their mesh, then the experts' EP slices gathered."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from roll_lite.strategy.expert_parallel import expert_parameters

    ep, experts = strategy.expert_parallel, {id(p) for p in expert_parameters(strategy.model)}
    grads = {}
    for name, param in strategy.model.named_parameters():
        grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
        if id(param) in experts:
            pieces = [torch.empty_like(grad) for _ in range(ep.size)]
            dist.all_gather(pieces, grad.contiguous(), group=ep.group)
            grad = torch.cat(pieces)
        grads[name.removeprefix("lm.")] = grad
    return grads


def _config(ep: int, grad_accum_steps: int = 1, packed: bool = False, budget: bool = False, **changes):
    from roll_lite.strategy import StrategyConfig

    settings = dict(
        grad_accum_steps=grad_accum_steps,
        use_packing=packed,
        max_tokens_per_micro_batch=BUDGET if budget else None,
        lr=0.0,  # the weights stay as built: every case steps from the same ones
        max_grad_norm=None,
        param_dtype="float64",
        logprob_chunk_size=8,
        expert_parallel=ep,
    )
    return StrategyConfig(**{**settings, **changes})


def _share(world_size: int, rank: int, packed: bool = False):
    from roll_lite.strategy.micro_batches import split_for_data_parallel

    data = global_batch(torch.float64)
    data.meta_info.update(loss_mask_keys=MASK_KEYS[LOSS[0]], moe_aux_losses=True)
    return split_for_data_parallel(data, world_size, balance_tokens=packed)[rank]


def _rank_main(rank: int, world_size: int, port: int, cases: list[EpCase], out_path: str):
    join_group(rank, world_size, port)
    import roll_lite.strategy.expert_parallel as expert_parallel
    from roll_lite.strategy import FSDP2Strategy

    results, right = {}, expert_parallel.restore_slot_order
    for case in cases:
        strategy = FSDP2Strategy(moe_lm(), _config(case.ep, case.grad_accum_steps, case.packed, case.budget))
        if case.miscombine:
            expert_parallel.restore_slot_order = lambda returned, order: returned
        metrics = strategy.train_step(_share(world_size, rank, case.packed), case_loss(MoeCase(world_size, 1, False)))
        expert_parallel.restore_slot_order = right
        results[case] = (metrics["loss"], _whole_gradients(strategy), metrics)
    if world_size == 2:  # EP = 2 against EP = 1: every token's log-prob and entropy; the experts gathered whole
        share = _share(world_size, rank)
        outputs = [FSDP2Strategy(moe_lm(), _config(ep)).compute_log_probs(share, with_entropy=True) for ep in (1, 2)]
        results["log_probs"] = [(out["log_probs"], out["entropy"]) for out in outputs]
        results["state"] = FSDP2Strategy(moe_lm(), _config(2)).full_state_dict()
        results["checkpoint"] = _checkpoint_round_trip(
            rank, world_size, os.path.join(os.path.dirname(out_path), "ckpt")
        )
    if rank == 0:
        torch.save(results, out_path)
    leave_group()


def _checkpoint_round_trip(rank: int, world_size: int, folder: str) -> dict:
    """A step at EP = 2 (clipped: the grad norm over both meshes), saved; loaded at EP = 2 and at EP = 1: the
    weights as saved, then one more step each (its Adam moments loaded too), against the saving strategy's."""
    from roll_lite.strategy import FSDP2Strategy

    def strategy(ep: int):
        return FSDP2Strategy(moe_lm(), _config(ep, lr=1e-2, max_grad_norm=0.5))

    share, loss = _share(world_size, rank), case_loss(MoeCase(world_size, 1, False))
    trained = strategy(2)
    trained.train_step(share, loss)
    trained.save_checkpoint(folder)
    states = {}
    for name, resumed in (("saved", trained), ("ep2", strategy(2)), ("ep1", strategy(1))):
        if resumed is not trained:
            resumed.load_checkpoint(folder)
        loaded = resumed.full_state_dict()
        grad_norm = resumed.train_step(share, loss)["grad_norm"]
        states[name] = (loaded, resumed.full_state_dict(), grad_norm)
    return states


@pytest.fixture(scope="module")
def ep_results():
    results = {}
    for world_size in (2, 4):
        with tempfile.TemporaryDirectory() as tmp:
            out_path = os.path.join(tmp, "results.pt")
            cases = [c for c in CASES + WRONG if c.world_size == world_size]
            spawn_ranks(_rank_main, world_size, cases, out_path)
            results.update(torch.load(out_path, weights_only=False))
    return results


@pytest.fixture(scope="module")
def global_reference():
    return moe_reference()


def _errors(result, reference) -> tuple[float, float]:
    (loss, grads, _), (ref_loss, ref_grads, _) = result, reference
    assert set(grads) == set(ref_grads), set(grads) ^ set(ref_grads)
    return relative_deviation(loss, ref_loss), max(relative_deviation(grads[n], ref_grads[n]) for n in ref_grads)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_expert_parallel_equals_global_batch(case, ep_results, global_reference):
    loss_error, grad_error = _errors(ep_results[case], global_reference)
    assert loss_error <= 1e-10 and grad_error <= 1e-10, (loss_error, grad_error)
    metrics, (_, ref_grads, aux) = ep_results[case][2], global_reference
    if case.budget:  # the ranks' shares need 2 and 1 micro-batches (test_exactness.py)
        assert metrics["num_micro_batches"] == 2
    assert all(relative_deviation(metrics[name], value) <= 1e-10 for name, value in aux.items()), (metrics, aux)
    norm = torch.stack([g.norm() for g in ref_grads.values()]).norm().item()
    assert relative_deviation(metrics["grad_norm"], norm) <= 1e-10, (metrics["grad_norm"], norm)


@pytest.mark.parametrize("case", WRONG, ids=[c.id for c in WRONG])
def test_misrouted_combine_is_caught(case, ep_results, global_reference):
    loss_error, grad_error = _errors(ep_results[case], global_reference)
    assert loss_error > 1e-6 and grad_error > 1e-6, (loss_error, grad_error)


def test_log_probs_equal_ep1_token_by_token(ep_results):
    (ep1_log_probs, ep1_entropy), (ep2_log_probs, ep2_entropy) = ep_results["log_probs"]
    assert ep1_log_probs.shape == ep2_log_probs.shape
    # bit for bit: the same expert weights on the same tokens, and a token's top-2 outputs summed in either order
    # (EP = 1 adds them expert by expert, EP = 2 slot by slot) give the same float
    assert torch.equal(ep2_log_probs, ep1_log_probs) and torch.equal(ep2_entropy, ep1_entropy)


def test_full_state_dict_gathers_every_expert(ep_results):
    built = {name: value for name, value in moe_lm().state_dict().items()}
    state = ep_results["state"]
    assert set(state) == set(built), set(state) ^ set(built)
    assert all(torch.equal(state[name], built[name]) for name in built)


def test_expert_parallel_is_checked():
    """Before Ray starts (load_config) and in the strategy: errors that name the key."""
    from roll_lite.pipelines.preflight import _check_moe
    from transformers import PretrainedConfig

    from roll_lite.config import ConfigError, load_config
    from roll_lite.loss.checker import TINY_MODEL
    from roll_lite.model.modeling import build_causal_lm
    from roll_lite.strategy import FSDP2Strategy

    moe = ["model.model_type=qwen3_moe", "model.num_experts=4", "actor.expert_parallel=2"]
    refused = [
        ("actor.expert_parallel: 2 needs an MoE policy; model.model_type=qwen2", ["actor.expert_parallel=2"]),
        ("actor.expert_parallel: 2 does not divide workers.actor_dp: 3", [*moe, "workers.actor_dp=3"]),
        (
            "actor.expert_parallel: 8 does not divide the model's 4 experts",
            [*moe, "actor.expert_parallel=8", "workers.actor_dp=8"],
        ),
        ("actor.expert_parallel: 2 with actor.sequence_parallel=2", [*moe, "actor.sequence_parallel=2"]),
        ("actor.expert_parallel: 2 with LoRA", [*moe, "workers.actor_dp=2", "actor.lora.rank=4"]),
        ("actor.expert_parallel: 2 with the exact rollout mode", [*moe, "workers.actor_dp=2", "rollout.exact=true"]),
        (
            "actor.expert_parallel: 2 with gradient checkpointing",
            [*moe, "workers.actor_dp=2", "model.gradient_checkpointing=true"],
        ),
        ("critic.expert_parallel: only the actor's experts are split", [*moe[:2], "critic.expert_parallel=2"]),
    ]
    for message, overrides in refused:
        with pytest.raises(ConfigError, match=message):
            load_config(None, overrides)
    config = load_config(None, [*moe, "workers.actor_dp=2"])  # a pretrained model's experts: pipelines/preflight.py
    _check_moe(config, PretrainedConfig(num_experts=4))
    with pytest.raises(ConfigError, match="actor.expert_parallel: model.pretrained_path's config.json names no"):
        _check_moe(config, PretrainedConfig())
    with pytest.raises(ConfigError, match="actor.expert_parallel: 2 does not divide the model's 3 experts"):
        _check_moe(config, PretrainedConfig(num_experts=3))
    with pytest.raises(ValueError, match="strategy.expert_parallel: 2 needs an MoE model"):
        FSDP2Strategy(build_causal_lm(TINY_MODEL, seed=0), _config(2))
    with pytest.raises(ValueError, match="strategy.expert_parallel: 2 does not divide the role's 1 ranks"):
        FSDP2Strategy(moe_lm(), _config(2))


def test_a_checkpoint_at_ep2_resumes_at_ep2_and_at_ep1(ep_results):
    """The experts go into the checkpoint as pieces of whole tensors (global_expert_view), so DCP reshards them."""
    runs = ep_results["checkpoint"]
    saved, stepped, grad_norm = runs["saved"]
    assert grad_norm > 0.5  # clipped
    for name in ("ep2", "ep1"):
        loaded, resumed, resumed_norm = runs[name]
        assert all(torch.equal(loaded[key], saved[key]) for key in saved), name
        assert relative_deviation(resumed_norm, grad_norm) <= 1e-10, (name, resumed_norm, grad_norm)
        assert max(relative_deviation(resumed[key], stepped[key]) for key in stepped) <= 1e-10, name
