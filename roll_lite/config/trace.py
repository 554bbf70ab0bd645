"""The `trace` section: the per-sample rollout traces each step writes into the run directory
(roll_lite/runtime/traces.py, docs/traces.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from roll_lite.config.key_checks import check


@dataclass
class TraceConfig:
    """Per-sample traces: <output_dir>/<run_name>/traces/step_NNNNNN.parquet, one file per step (docs/traces.md)."""

    # all: every sample of the step; N: its first N samples (a GRPO group stays whole when N is a multiple
    # of rollout.num_samples); 0: no traces. Also a wandb table per step when wandb_mode is not disabled
    samples_per_step: Any = "all"


def validate_trace(trace: TraceConfig) -> None:
    value = trace.samples_per_step
    check(
        value == "all" or (isinstance(value, int) and not isinstance(value, bool) and value >= 0),
        "trace.samples_per_step",
        f"must be all or a whole number >= 0 (0: no traces), got {value!r}",
    )


def traced_count(trace: TraceConfig, rows: int) -> int:
    """How many of a step's `rows` samples its trace holds: its first ones."""
    return rows if trace.samples_per_step == "all" else min(int(trace.samples_per_step), rows)
