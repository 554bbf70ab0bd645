"""Packing: balancing, budgets, and packed log-probs equal padded ones for Qwen2 and Llama."""

import pytest
import torch

from roll_lite.data import DataProto
from roll_lite.loss.checker import random_rl_batch
from roll_lite.model.modeling import CausalLMWithLogProbs, build_causal_lm
from roll_lite.model.packing import (
    karmarkar_karp,
    pack_rows,
    row_lengths,
    token_budget_groups,
    unpack_next_token_values,
)
from roll_lite.strategy.config import StrategyConfig
from roll_lite.strategy.micro_batches import forward_micro_batch

MODELS = {
    "qwen2": dict(
        model_type="qwen2",
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    ),
    "llama": dict(
        model_type="llama",
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    ),
}


def test_karmarkar_karp_balances_and_covers_every_index():
    weights = [8, 7, 6, 5, 4, 3, 2, 1, 9, 12]
    parts = karmarkar_karp(weights, 3)
    assert sorted(i for part in parts for i in part) == list(range(len(weights)))
    sums = sorted(sum(weights[i] for i in part) for part in parts)
    assert sums[-1] - sums[0] <= 1  # 57 over 3 parts: 19/19/19 is reachable
    assert karmarkar_karp([], 2) == [[], []]
    assert karmarkar_karp([5], 3) == [[0], [], []]


def test_token_budget_groups_respect_the_budget():
    lengths = [5, 9, 3, 7, 2, 8]
    groups = token_budget_groups(lengths, 10)
    assert sorted(i for g in groups for i in g) == list(range(6))
    assert all(sum(lengths[i] for i in g) <= 10 for g in groups)
    assert len(groups) == 4  # 34 tokens need at least 4 bins of 10
    with pytest.raises(ValueError, match="row 1 has 9 tokens"):
        token_budget_groups(lengths, 8)


def test_row_lengths_requires_right_padding():
    assert row_lengths(torch.tensor([[1, 1, 0], [1, 0, 0]])) == [2, 1]
    with pytest.raises(ValueError, match=r"rows \[1\]"):
        row_lengths(torch.tensor([[1, 1, 0], [0, 1, 1]]))


def test_pack_and_unpack_positions():
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]])
    packed = pack_rows(ids, [3, 2])
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 9]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    assert packed.cu_seqlens.tolist() == [0, 3, 5] and packed.max_seqlen == 3
    # next-token values at packed positions 0..4 -> token-aligned rows
    values = torch.tensor([[10.0, 11.0, 12.0, 13.0, 14.0]])
    assert unpack_next_token_values(values, packed, 4).tolist() == [[0, 10, 11, 0], [0, 13, 0, 0]]


def naive_token_log_probs(lm, data):
    """Per-row forward of the plain HF model (no padding at all), full logits, log_softmax."""
    out = torch.zeros(data["input_ids"].shape, dtype=torch.float64)
    for i, length in enumerate(row_lengths(data["attention_mask"])):
        ids = data["input_ids"][i : i + 1, :length]
        logits = lm(input_ids=ids, use_cache=False).logits.double()
        log_probs = torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        out[i, 1:length] = log_probs
    return out


@pytest.mark.parametrize("model_type", sorted(MODELS))
def test_packed_equals_padded_equals_per_sequence(model_type):
    lm = build_causal_lm(MODELS[model_type], dtype=torch.float64, seed=0)
    model = CausalLMWithLogProbs(lm, chunk_size=16)
    data = random_rl_batch(num_rows=6, seq_len=20, seed=3)
    expected = naive_token_log_probs(lm, data)

    results = {}
    for packing in (False, True):
        params = list(model.parameters())
        output = forward_micro_batch(model, data, StrategyConfig(use_packing=packing), with_entropy=True)
        weights = torch.randn(
            output["log_probs"].shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64
        )
        grads = torch.autograd.grad((output["log_probs"] * weights).sum() + output["entropy"].sum(), params)
        results[packing] = (output, grads)
        torch.testing.assert_close(output["log_probs"], expected, rtol=1e-12, atol=1e-12)

    (padded, padded_grads), (packed, packed_grads) = results[False], results[True]
    torch.testing.assert_close(packed["entropy"], padded["entropy"], rtol=1e-12, atol=1e-12)
    for got, want in zip(packed_grads, padded_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_packed_rows_do_not_see_each_other():
    # Row 0 comes first in the packed row: changing its tokens must not change any later row.
    lm = build_causal_lm(MODELS["qwen2"], dtype=torch.float64, seed=0)
    model = CausalLMWithLogProbs(lm)
    data = random_rl_batch(num_rows=4, seq_len=12, seed=1)
    changed = data["input_ids"].clone()
    changed[0] = (changed[0] * 7 + 3) % 64 * data["attention_mask"][0]
    config = StrategyConfig(use_packing=True)
    before = forward_micro_batch(model, data, config, with_entropy=False)["log_probs"]
    after = forward_micro_batch(model, DataProto({**data.batch, "input_ids": changed}), config, with_entropy=False)[
        "log_probs"
    ]
    assert torch.equal(before[1:], after[1:]) and not torch.equal(before[0], after[0])


def test_varlen_attention_equals_attention_per_sequence():
    from roll_lite.model.attention import varlen_attention_forward

    gen = torch.Generator().manual_seed(0)
    lengths = [3, 1, 5]
    q = torch.randn(1, 4, 9, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 2, 9, 8, generator=gen, dtype=torch.float64)  # grouped-query: 2 kv heads
    v = torch.randn(1, 2, 9, 8, generator=gen, dtype=torch.float64)
    cu = torch.tensor([0, 3, 4, 9], dtype=torch.int32)
    out, _ = varlen_attention_forward(None, q, k, v, None, scaling=0.3, cu_seq_lens_q=cu, max_length_q=5)
    assert out.shape == (1, 9, 4, 8)
    start = 0
    for length in lengths:
        end = start + length
        ks, vs = (t[:, :, start:end].repeat_interleave(2, dim=1) for t in (k, v))
        scores = (q[:, :, start:end] @ ks.transpose(-1, -2)) * 0.3
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        expected = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1) @ vs
        torch.testing.assert_close(out[:, start:end], expected.transpose(1, 2), rtol=1e-12, atol=1e-12)
        start = end


def test_packed_forward_takes_the_varlen_path(monkeypatch):
    import roll_lite.model.attention as attention

    calls = []
    original = attention._per_sequence_sdpa
    monkeypatch.setattr(attention, "_per_sequence_sdpa", lambda *a: calls.append(a[3].tolist()) or original(*a))
    model = CausalLMWithLogProbs(build_causal_lm(MODELS["llama"], dtype=torch.float64, seed=0))
    data = random_rl_batch(num_rows=4, seq_len=10, seed=2)
    forward_micro_batch(model, data, StrategyConfig(use_packing=True), with_entropy=False)
    expected_cu = [0] + torch.cumsum(data["attention_mask"].sum(-1), 0).tolist()
    assert calls == [expected_cu] * 2  # once per decoder layer, with the rows' boundaries


@pytest.fixture
def fresh_path_choice(monkeypatch):
    import roll_lite.model.attention as attention

    monkeypatch.delenv(attention.OVERRIDE_ENV, raising=False)
    attention._choose_path.cache_clear()
    yield attention
    attention._choose_path.cache_clear()


def test_packed_attention_path_says_what_it_chose_and_why(fresh_path_choice, monkeypatch):
    attention = fresh_path_choice
    cuda = torch.device("cuda")  # only the choice is tested here: nothing runs on the device
    path, why = attention.packed_attention_path(torch.device("cpu"), torch.float32)
    assert path == "per-sequence-sdpa" and "device is cpu" in why
    path, why = attention.packed_attention_path(cuda, torch.float32)
    assert path == "per-sequence-sdpa" and "compute dtype is float32" in why

    monkeypatch.setattr(attention, "flash_attn_available", lambda: False)
    monkeypatch.setattr(attention, "torch_varlen_available", lambda: True)
    path, why = attention.packed_attention_path(cuda, torch.bfloat16)
    assert path == "torch-varlen" and "not flash-attn: flash-attn is not installed" in why
    path, why = attention.packed_attention_path(cuda, torch.bfloat16, 0.1)
    assert path == "per-sequence-sdpa" and "dropout" in why
    monkeypatch.setattr(attention, "flash_attn_available", lambda: True)
    assert attention.packed_attention_path(cuda, torch.float16, 0.1)[0] == "flash-attn"


def test_packed_attention_override_is_checked(fresh_path_choice, monkeypatch):
    attention = fresh_path_choice
    monkeypatch.setenv(attention.OVERRIDE_ENV, "per-sequence-sdpa")
    assert attention.packed_attention_path(torch.device("cpu"), torch.float32) == (
        "per-sequence-sdpa",
        "forced by ROLL_LITE_PACKED_ATTENTION",
    )
    monkeypatch.setenv(attention.OVERRIDE_ENV, "torch-varlen")
    with pytest.raises(ValueError, match="ROLL_LITE_PACKED_ATTENTION=torch-varlen cannot run: device is cpu"):
        attention.packed_attention_path(torch.device("cpu"), torch.bfloat16)
    monkeypatch.setenv(attention.OVERRIDE_ENV, "flash")
    with pytest.raises(ValueError, match="'flash' is not one of auto, flash-attn, torch-varlen, per-sequence-sdpa"):
        attention.packed_attention_path(torch.device("cpu"), torch.float32)


def test_torch_varlen_wrapper_follows_the_varlen_attn_contract(monkeypatch):
    # The real kernel is CUDA-only (benchmarks/cuda_check.py checks it on a GPU). Here a stand-in
    # with varlen_attn's documented contract checks what the wrapper passes: [tokens, heads, dim]
    # tensors, int32 offsets, window_size=(-1, 0) for causal, the model's scale, kv heads expanded.
    import torch.nn.attention.varlen as varlen

    from roll_lite.model.attention import _per_sequence_sdpa, _torch_varlen

    def contract(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), **unused):
        assert q.dim() == 3 and q.shape == k.shape == v.shape and cu_q.dtype == torch.int32
        assert window_size == (-1, 0) and max_q == max_k == int((cu_q[1:] - cu_q[:-1]).max())
        out = torch.empty_like(q)
        for start, end in zip(cu_q[:-1].tolist(), cu_q[1:].tolist()):
            scores = torch.einsum("qhd,khd->hqk", q[start:end], k[start:end]) * scale
            causal = torch.ones(end - start, end - start, dtype=torch.bool).tril()
            out[start:end] = torch.einsum(
                "hqk,khd->qhd", scores.masked_fill(~causal, float("-inf")).softmax(-1), v[start:end]
            )
        return out

    monkeypatch.setattr(varlen, "varlen_attn", contract)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 9, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 9, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    cu = torch.tensor([0, 3, 4, 9])
    got = _torch_varlen(q, k, v, cu, 5, 0.3)
    torch.testing.assert_close(got, _per_sequence_sdpa(q, k, v, cu, 0.3, 0.0), rtol=1e-12, atol=1e-12)
