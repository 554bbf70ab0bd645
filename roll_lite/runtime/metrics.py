"""Metric reduction by name suffix: '@sum', '@mean' (default), '@max', '@min'.

A loss or metric computed with the step's global denominators is one share of a global value:
report it with '@sum'. Values are collected per micro-batch on each rank, then reduced over all
micro-batches of all ranks; the suffix is stripped from the reported name.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

import torch

REDUCTIONS = ("sum", "mean", "max", "min")


def split_metric_name(name: str) -> tuple[str, str]:
    base, sep, reduction = name.rpartition("@")
    if not sep:
        return name, "mean"
    if reduction not in REDUCTIONS:
        raise ValueError(
            f"metric '{name}': unknown reduction '@{reduction}'; use one of " + ", ".join("@" + r for r in REDUCTIONS)
        )
    return base, reduction


def to_float(value) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"a metric must be a scalar, got a tensor of shape {tuple(value.shape)}")
        return float(value.detach().item())
    return float(value)


def reduce_metrics(records: Iterable[Mapping[str, object]]) -> dict[str, float]:
    """Reduce per-micro-batch metric dicts (from every rank) into one value per stripped name."""
    values: dict[str, list[float]] = {}
    reductions: dict[str, str] = {}
    for record in records:
        for name, value in record.items():
            base, reduction = split_metric_name(name)
            if reductions.setdefault(base, reduction) != reduction:
                raise ValueError(
                    f"metric '{base}' is reported with two reductions: @{reductions[base]} and @{reduction}"
                )
            values.setdefault(base, []).append(to_float(value))
    reducers: dict[str, Callable[[list[float]], float]] = {
        "sum": sum,
        "mean": lambda v: sum(v) / len(v),
        "max": max,
        "min": min,
    }
    return {base: reducers[reductions[base]](v) for base, v in values.items()}
