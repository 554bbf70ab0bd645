"""The strategy beyond the gradient: clipping, optimizer step, metrics, log-probs, errors."""

import math
from pathlib import Path

import pytest
import torch
from distributed_harness import OPTIMIZER_CASE, OPTIMIZER_SETTINGS, optimizer_step_on_this_rank, reference
from loss_cases import global_batch, make_loss
from spawned_ranks import join_group, leave_group, spawn_ranks

from roll_lite.data import DataProto
from roll_lite.loss.checker import TINY_MODEL, random_rl_batch
from roll_lite.model.modeling import build_causal_lm
from roll_lite.runtime.metrics import reduce_metrics
from roll_lite.strategy import FSDP2Strategy, StrategyConfig
from roll_lite.strategy.micro_batches import micro_batch_groups


def _two_ranks(rank: int, world_size: int, port: int, out_dir: str):
    """Both two-rank checks in one spawn of ranks: a clipped AdamW step, then the start-up broadcast."""
    join_group(rank, world_size, port)
    metrics, state = optimizer_step_on_this_rank(rank, world_size)
    if rank == 0:
        torch.save((metrics, state), f"{out_dir}/step.pt")
    from roll_lite.strategy import distributed

    distributed.BROADCAST_BUCKET_BYTES = 100  # a few tensors per bucket, and one tensor larger than a bucket
    generator = torch.Generator().manual_seed(rank)
    tensors = [
        torch.randn(3, 4, generator=generator, dtype=torch.float64),
        torch.randn(5, 6, generator=generator).t(),  # not contiguous
        torch.randn(7, generator=generator).to(torch.bfloat16),
        torch.randint(0, 1000, (4,), generator=generator),
        torch.randn(2, generator=generator, dtype=torch.float64),
        torch.randn(40, generator=generator),  # 160 bytes: a bucket of its own
        torch.randn(0, generator=generator),
        torch.randn(3, generator=generator, dtype=torch.float64),
    ]
    before = [t.clone() for t in tensors]
    distributed.broadcast_from_rank0(tensors)
    torch.save((before, tensors), f"{out_dir}/{rank}.pt")
    leave_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    """The folder the two ranks of _two_ranks wrote into."""
    folder = tmp_path_factory.mktemp("two_ranks")
    spawn_ranks(_two_ranks, 2, str(folder))
    return folder


def test_clipped_adamw_step_on_two_ranks_matches_a_hand_step(two_ranks):
    metrics, state = torch.load(two_ranks / "step.pt", weights_only=False)
    ref_loss, ref_grads = reference(*OPTIMIZER_CASE, torch.float64)
    norm = math.sqrt(sum(g.square().sum().item() for g in ref_grads.values()))
    assert metrics["grad_norm"] == pytest.approx(norm, rel=1e-10)
    assert metrics["loss"] == pytest.approx(ref_loss, rel=1e-10)
    # The same step by hand: clip to max_grad_norm, then torch's AdamW.
    lm = build_causal_lm(TINY_MODEL, dtype=torch.float64, seed=0)
    scale = min(1.0, OPTIMIZER_SETTINGS["max_grad_norm"] / (norm + 1e-6))
    for name, p in lm.named_parameters():
        p.grad = ref_grads[name] * scale
    torch.optim.AdamW(
        lm.parameters(), lr=OPTIMIZER_SETTINGS["lr"], weight_decay=OPTIMIZER_SETTINGS["weight_decay"]
    ).step()
    for name, p in lm.named_parameters():
        torch.testing.assert_close(state[name], p.detach(), rtol=1e-9, atol=1e-12)
    assert scale < 1.0  # the clip was active


def test_ranks_start_from_rank_zeros_tensors_bit_for_bit(two_ranks):
    # FSDP2Strategy._shard's broadcast_from_rank0: bucketed by dtype and size, flattened, copied back.
    before0, after0 = torch.load(two_ranks / "0.pt")
    before1, after1 = torch.load(two_ranks / "1.pt")
    assert not torch.equal(before0[0], before1[0])  # the ranks did start apart
    for b0, a0, a1 in zip(before0, after0, after1):
        assert a1.dtype == b0.dtype and a1.shape == b0.shape
        assert torch.equal(a0, b0) and torch.equal(a1, b0)
    assert not after1[1].is_contiguous()  # written in place, layout kept


@pytest.mark.parametrize(
    "dtype, packing, fused", [(torch.float32, False, False), (torch.float64, True, False), (torch.float32, False, True)]
)
def test_one_rank_unwrapped_trains_bit_for_bit_as_fsdp2_on_one_rank(dtype, packing, fused):
    """One rank with nothing to cast trains the bare model; FSDP2 with a single shard is the same math,
    with foreach AdamW or fused (reproducible=portable's)."""
    config = StrategyConfig(
        use_packing=packing,
        grad_accum_steps=2,
        param_dtype=str(dtype).removeprefix("torch."),
        lr=1e-2,
        weight_decay=0.1,
        adamw_fused=fused,
    )
    bare, wrapped = (
        FSDP2Strategy(build_causal_lm(TINY_MODEL, dtype=dtype, seed=0), config, shard_single_rank=shard)
        for shard in (False, True)
    )
    assert not bare.sharded and wrapped.sharded
    for step in range(3):
        data = random_rl_batch(num_rows=8, seq_len=12, seed=step, dtype=dtype)
        data.meta_info["loss_mask_keys"] = ["response_mask"]
        bare_metrics, wrapped_metrics = (
            s.train_step(data, make_loss("ppo", "seq-mean-token-mean")) for s in (bare, wrapped)
        )
        assert bare_metrics == wrapped_metrics and bare_metrics["grad_norm"] > 0
    bare_state, wrapped_state = bare.full_state_dict(), wrapped.full_state_dict()
    assert set(bare_state) == set(wrapped_state)
    for name, value in bare_state.items():
        assert torch.equal(value, wrapped_state[name]), name
    torch.testing.assert_close(
        bare.compute_log_probs(data)["log_probs"], wrapped.compute_log_probs(data)["log_probs"], rtol=0, atol=0
    )


@pytest.fixture(scope="module")
def strategy():
    config = StrategyConfig(use_packing=True, max_tokens_per_micro_batch=30, param_dtype="float64", lr=0.0)
    return FSDP2Strategy(build_causal_lm(TINY_MODEL, dtype=torch.float64, seed=0), config)


def test_compute_log_probs_keeps_row_order(strategy):
    data = global_batch(torch.float64)
    out = strategy.compute_log_probs(data, with_entropy=True)
    lm = build_causal_lm(TINY_MODEL, dtype=torch.float64, seed=0)
    with torch.no_grad():
        logits = lm(input_ids=data["input_ids"], attention_mask=data["attention_mask"], use_cache=False).logits
    expected = torch.log_softmax(logits[:, :-1], -1).gather(-1, data["input_ids"][:, 1:, None]).squeeze(-1)
    valid = data["attention_mask"].bool()[:, 1:]
    torch.testing.assert_close(out["log_probs"][:, 1:], torch.where(valid, expected, 0.0), rtol=1e-12, atol=1e-12)
    assert out["entropy"].shape == data["input_ids"].shape


def test_metrics_are_reduced_by_suffix(strategy):
    data = random_rl_batch(num_rows=8, seq_len=12, seed=5)

    def loss_func(batch, output):
        rows = len(batch)
        metrics = {"rows@sum": rows, "rows_max@max": rows, "rows_min@min": rows, "rows_mean": rows}
        return output["log_probs"].sum() * 0.0, metrics

    metrics = strategy.train_step(data, loss_func)
    sizes = [len(group) for group in micro_batch_groups(data, strategy.config)]
    assert len(sizes) > 1 and metrics["num_micro_batches"] == len(sizes)
    assert metrics["rows"] == 8 and metrics["rows_max"] == max(sizes) and metrics["rows_min"] == min(sizes)
    assert metrics["rows_mean"] == pytest.approx(8 / len(sizes))


def test_reduce_metrics_by_hand():
    records = [{"a@sum": 1.0, "b@max": 2.0, "c": 3.0}, {"a@sum": 2.5, "b@max": -1.0, "c": 5.0, "d@min": 7}]
    assert reduce_metrics(records) == {"a": 3.5, "b": 2.0, "c": 4.0, "d": 7.0}
    with pytest.raises(ValueError, match="@median"):
        reduce_metrics([{"x@median": 1.0}])
    with pytest.raises(ValueError, match="two reductions"):
        reduce_metrics([{"x@sum": 1.0}, {"x@max": 1.0}])


def test_train_step_errors_name_the_problem(strategy):
    data = random_rl_batch(num_rows=4, seq_len=8)
    loss = lambda b, o: (o["log_probs"].sum(), {})  # noqa: E731
    with pytest.raises(KeyError, match="loss_mask_keys"):
        strategy.train_step(DataProto(data.batch), loss)
    with pytest.raises(KeyError, match=r"\['kl_mask'\] are not tensors"):
        strategy.train_step(DataProto(data.batch, meta_info={"loss_mask_keys": ["kl_mask"]}), loss)
    with pytest.raises(ValueError, match="does not depend on the model output"):
        strategy.train_step(data, lambda b, o: (torch.tensor(1.0), {}))


def test_config_errors_name_the_key():
    with pytest.raises(
        ValueError, match="strategy.max_tokens_per_micro_batch: token-budget micro-batches need use_packing"
    ):
        StrategyConfig(max_tokens_per_micro_batch=10).validate("strategy.")
    with pytest.raises(ValueError, match="lr_schedule: 'linear' is not one of constant, cosine"):
        StrategyConfig(lr_schedule="linear").validate()


def test_a_weighted_mask_is_rejected_naming_its_key(strategy):
    data = random_rl_batch(num_rows=4, seq_len=8)
    data.batch["response_mask"] = data["response_mask"] * 2
    with pytest.raises(ValueError, match="mask 'response_mask' holds values other than 0 and 1"):
        strategy.train_step(data, lambda b, o: (o["log_probs"].sum(), {}))


@pytest.mark.parametrize(
    "returned, message",
    [
        (lambda o: o["log_probs"].sum(), r"must return \(loss, metrics\).*returned a Tensor"),
        (lambda o: (o["log_probs"].sum(), {}, 1), r"must return \(loss, metrics\).*returned a tuple of length 3"),
        (lambda o: (o["log_probs"], {}), r"returned a loss of \(4, 8\), not a scalar tensor"),
        (lambda o: (o["log_probs"].sum(), [1.0]), "returned metrics of type list"),
    ],
)
def test_a_loss_func_breaking_the_contract_is_named(strategy, returned, message):
    data = random_rl_batch(num_rows=4, seq_len=8)

    def my_loss(batch, output):
        return returned(output)

    with pytest.raises(TypeError, match=message) as error:
        strategy.train_step(data, my_loss)
    assert "my_loss" in str(error.value)
