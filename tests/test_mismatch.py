"""The engine / trainer mismatch metrics (roll_lite/loss/mismatch.py, pipelines/mismatch.py) against
hand computations: quantiles with a mask, an empty mask, the band's edges, the per-sequence KL, the
version split, and the same numbers whether a step's tokens come in one piece or in micro-batches."""

import math

import pytest
import torch
from roll_lite.pipelines.mismatch import measure_mismatch, step_mismatch_metrics

from roll_lite.config import ConfigError, load_config
from roll_lite.data import DataProto
from roll_lite.loss import ppo_policy_loss_func
from roll_lite.loss.mismatch import (
    GAP_FLOOR,
    histogram_quantile,
    mismatch_metrics,
    mismatch_sums,
    upper_edge,
)
from roll_lite.runtime.metrics import reduce_metrics

BAND = (0.9, 1.1)
P = "rollout/mismatch/hf-float32"


def metrics_of(*sums):
    return mismatch_metrics(reduce_metrics(sums), P)


def test_histogram_quantiles_are_the_nearest_rank_bins_upper_edge_capped_at_the_max():
    counts = [0.0] * 182
    counts[0], counts[40], counts[100] = 2, 97, 1  # 2 below 1e-7, 97 in [10^-5.05, 1e-5), 1 in [10^-2.05, 1e-2)
    assert histogram_quantile(counts, 0.01, maximum=0.0095) == GAP_FLOOR  # rank 1: the first bin's edge
    assert histogram_quantile(counts, 0.5, maximum=0.0095) == pytest.approx(1e-5)  # rank 50
    assert histogram_quantile(counts, 0.99, maximum=0.0095) == pytest.approx(1e-5)  # rank 99 (not 100)
    assert histogram_quantile(counts, 1.0, maximum=0.0095) == 0.0095  # the edge 0.01, capped at the max
    assert histogram_quantile([3.0], 0.5, maximum=0.0) == 0.0  # every gap 0: the max caps the first bin's edge
    assert upper_edge(100) == pytest.approx(1e-2) and math.isinf(upper_edge(181))


def test_gap_quantiles_max_and_band_over_the_masked_tokens_only():
    # Δ = engine - trainer on the mask: |Δ| = 0.0011, 0.0021, 0.0051, 0.0105, 0.5; the 50 is outside it
    engine = torch.tensor([[0.0011, -0.0021, 0.0051, 50.0], [0.0105, 0.5, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    m = metrics_of(mismatch_sums(engine, torch.zeros_like(engine), mask, BAND))
    # nearest rank: p50 is the 3rd of 5 (0.0051), in the bin [10^-2.3, 10^-2.25): its upper edge
    assert m[f"{P}/logp_gap_p50"] == pytest.approx(10**-2.25)
    assert 0.0051 <= m[f"{P}/logp_gap_p50"] <= 0.0051 * 10**0.05
    assert m[f"{P}/logp_gap_p99"] == m[f"{P}/logp_gap_max"] == pytest.approx(0.5)  # rank 5: the max itself
    assert m[f"{P}/tokens"] == 5
    assert m[f"{P}/ratio_out_of_band"] == pytest.approx(1 / 5)  # r = e^-0.5 only
    assert not any("current" in name or "older" in name for name in m)  # no split asked


def test_the_bands_edges_are_inside():
    log_high, log_low = math.log(1.1), math.log(0.9)
    trainer = torch.tensor([[log_high, log_high + 1e-4, log_low, log_low - 1e-4]], dtype=torch.float64)
    m = metrics_of(mismatch_sums(torch.zeros_like(trainer), trainer, torch.ones(1, 4), BAND))
    assert m[f"{P}/ratio_out_of_band"] == pytest.approx(2 / 4)  # r = 1.1 and 0.9 exactly: in [0.9, 1.1]
    m = metrics_of(mismatch_sums(torch.zeros_like(trainer), trainer, torch.ones(1, 4), (0.8, 1.2)))
    assert m[f"{P}/ratio_out_of_band"] == 0


def test_per_sequence_kl_k1_and_k3_means_and_maxima():
    engine = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    trainer = torch.tensor([[-1.2, -1.7, 0.0], [-0.1, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # the third row has no token: not a sequence
    m = metrics_of(mismatch_sums(engine, trainer, mask, BAND))

    def k3(delta):  # r = π_trainer / π_engine = e^-Δ
        return (math.exp(-delta) - 1) + delta

    rows = [[0.2, -0.3], [-0.4]]  # Δ per token
    k1 = [sum(row) / len(row) for row in rows]
    k3s = [sum(k3(d) for d in row) / len(row) for row in rows]
    assert m[f"{P}/seq_kl_k1_mean"] == pytest.approx(sum(k1) / 2)
    assert m[f"{P}/seq_kl_k1_max"] == pytest.approx(max(k1))  # -0.05
    assert m[f"{P}/seq_kl_k3_mean"] == pytest.approx(sum(k3s) / 2)
    assert m[f"{P}/seq_kl_k3_max"] == pytest.approx(max(k3s)) and min(k3s) > 0


def test_an_empty_mask_or_split_reports_nothing():
    zeros = torch.zeros(2, 3)
    assert mismatch_sums(zeros, zeros, zeros, BAND) == {}
    assert metrics_of(mismatch_sums(zeros, zeros, zeros, BAND, current=zeros.bool())) == {}
    ones = torch.ones(2, 3)
    m = metrics_of(mismatch_sums(zeros, zeros, ones, BAND, current=ones.bool()))
    assert m[f"{P}/current_weights/tokens"] == 6 and not any("older_weights" in name for name in m)
    assert m[f"{P}/logp_gap_p50"] == m[f"{P}/logp_gap_max"] == 0.0


def test_the_version_split_and_micro_batches_reduce_to_the_whole_batchs_numbers():
    torch.manual_seed(0)
    trainer = torch.randn(6, 7)
    engine = trainer + 0.05 * torch.randn(6, 7)
    mask = (torch.rand(6, 7) > 0.3).long()
    current = torch.rand(6, 7) > 0.5
    whole = metrics_of(mismatch_sums(engine, trainer, mask, BAND, current))
    pieces = [mismatch_sums(engine[r], trainer[r], mask[r], BAND, current[r]) for r in (slice(0, 2), slice(2, 6))]
    assert metrics_of(*pieces) == pytest.approx(whole)
    for split in ("", "/current_weights", "/older_weights"):
        assert (
            whole[f"{P}{split}/logp_gap_p50"] <= whole[f"{P}{split}/logp_gap_p99"] <= whole[f"{P}{split}/logp_gap_max"]
        )
    older = mask.bool() & ~current
    gaps = (engine - trainer).abs()[older]
    row_means = [(engine - trainer)[row][older[row]].mean().item() for row in range(6) if older[row].any()]
    assert whole[f"{P}/older_weights/seq_kl_k1_mean"] == pytest.approx(sum(row_means) / len(row_means))
    assert whole[f"{P}/older_weights/seq_kl_k1_max"] == pytest.approx(max(row_means))
    assert whole[f"{P}/older_weights/logp_gap_max"] == pytest.approx(gaps.max().item())
    assert whole[f"{P}/older_weights/tokens"] + whole[f"{P}/current_weights/tokens"] == whole[f"{P}/tokens"]


def test_a_loss_reports_the_raw_sums_only_when_the_controller_asks():
    config = load_config(None, ["rollout.fully_async=true"])
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0]])
    actor = torch.tensor([[0.0, -1.0, -0.5, -2.0], [0.0, -0.2, -3.0, 0.0]])
    tensors = {
        "response_mask": mask,
        "rollout_log_probs": actor + torch.tensor([[0.0, 0.3, -0.01, 0.0], [0.0, 0.0, 0.2, 0.0]]),
        "rollout_versions": torch.tensor([[-1, 4, 4, 5], [-1, 5, 5, -1]]),
        "advantages": torch.ones(2, 4),
    }
    meta = {"batch_num_tokens": {"response_mask": 5}, "global_valid_samples": {"response_mask": 2}, "on_policy": True}
    batch = DataProto(tensors, meta_info=meta)
    loss = ppo_policy_loss_func("token-mean")
    assert not any(name.startswith("mismatch/") for name in loss(batch, {"log_probs": actor})[1])

    # on-policy (no old log-probs): the controller asks the loss, step 6 trains the weights of version 5
    assert measure_mismatch(batch, "response_mask", config, step=6, weights_behind=1) is None
    actor_metrics = reduce_metrics([loss(batch, {"log_probs": actor})[1]])
    m = step_mismatch_metrics(config, None, actor_metrics)
    assert not any(name.startswith("mismatch/") for name in actor_metrics)  # taken out of actor/...
    prefix = "rollout/mismatch/hf-float32"
    assert m[f"{prefix}/tokens"] == 5 and m[f"{prefix}/current_weights/tokens"] == 3
    assert m[f"{prefix}/older_weights/logp_gap_max"] == pytest.approx(0.3)  # version 4's tokens: 0.3, 0.01
    assert m[f"{prefix}/ratio_out_of_band"] == pytest.approx(2 / 5)  # r = e^-0.3, e^-0.2

    # old log-probs in the batch: the driver measures the whole batch itself, the same numbers
    driver = DataProto({**tensors, "old_log_probs": actor}, meta_info=dict(meta))
    sums = measure_mismatch(driver, "response_mask", config, step=6, weights_behind=1)
    assert sums is not None and "mismatch" not in driver.meta_info
    assert step_mismatch_metrics(config, sums, {}) == pytest.approx(m)

    # no engine log-probs: nothing asked, nothing logged
    del tensors["rollout_log_probs"]
    bare = DataProto(tensors, meta_info=dict(meta))
    assert measure_mismatch(bare, "response_mask", config, step=6, weights_behind=1) is None
    assert "mismatch" not in bare.meta_info and step_mismatch_metrics(config, None, {}) == {}


def test_a_bad_band_is_one_config_line():
    for band in ("[1.0,1.1]", "[0.9]", "[0.9,1.0]"):
        with pytest.raises(ConfigError, match=r"rollout.mismatch_band: must be \[low, high\]"):
            load_config(None, [f"rollout.mismatch_band={band}"])
