"""The engine / trainer mismatch metrics of a run's metrics.jsonl records (pipelines/mismatch.py), as
the end-to-end tests check them."""

import math

MISMATCH = "rollout/mismatch/hf-float32"  # rollout.engine-dtype (pipelines/mismatch.py)


def assert_mismatch_logged(records: list[dict], splits: list[set[str]], prefix: str = MISMATCH) -> None:
    """Every RL step logs the engine / trainer mismatch under `prefix`, finite and ordered; `splits`: each
    step's version splits (current_weights, older_weights) that have tokens."""
    for record, expected in zip(records, splits, strict=True):
        stats = {k[len(prefix) + 1 :]: v for k, v in record.items() if k.startswith(prefix + "/")}
        assert {key.rpartition("/")[0] for key in stats if "/" in key} == expected, record["step"]
        for base in ["", *(f"{split}/" for split in expected)]:
            values = [stats[base + name] for name in ("logp_gap_p50", "logp_gap_p99", "logp_gap_max")]
            assert all(math.isfinite(v) for v in values) and 0 <= values[0] <= values[1] <= values[2]
            assert 0 <= stats[base + "ratio_out_of_band"] <= 1 and stats[base + "tokens"] > 0
            assert all(math.isfinite(stats[f"{base}seq_kl_{k}"]) for k in ("k1_mean", "k1_max", "k3_mean", "k3_max"))
            # a mean of Δ over a row's tokens (of the split) is at most its largest |Δ|
            assert abs(stats[base + "seq_kl_k1_max"]) <= values[2] and stats[base + "seq_kl_k3_mean"] >= 0
        assert sum(stats[f"{split}/tokens"] for split in expected) in ({stats["tokens"]} if expected else {0})
