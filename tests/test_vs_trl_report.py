"""benchmarks/vs_trl_report.py: the time-to-reward measure of benchmarks/vs_trl.py, both sides treated alike."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from vs_trl_report import fair_table, first_reached, stays_at_or_above  # noqa: E402

EVALUATIONS = [(0, 5.0, 0.2), (5, 8.0, 0.9), (10, 11.0, 0.7), (15, 14.0, 0.9), (20, 17.0, 0.95)]


def test_first_reached_and_where_it_stays():
    assert first_reached(EVALUATIONS, 0.9) == (5, 8.0, 0.9)
    assert stays_at_or_above(EVALUATIONS, 0.9) == (15, 14.0, 0.9)  # the dip at step 10 restarts it
    assert stays_at_or_above(EVALUATIONS[:3], 0.9) is None  # ends below
    assert first_reached(EVALUATIONS, 0.99) is None


def run(variant: str, launched: list, wall_s: float, round_: int = 1) -> dict:
    return {"round": round_, "variant": variant, "run": variant, "launched": launched, "wall_s": wall_s}


def test_the_table_counts_time_from_launch_against_trls_own_evaluations(capsys):
    rows = [
        run("trl", [(0, 20.0, 0.2), (10, 30.0, 0.9), (20, 40.0, 0.85)], 42.0),  # target: its final 0.85
        run("ahead", [(0, 10.0, 0.2), (10, 18.0, 0.8), (20, 24.0, 0.9)], 28.0),
        run("worker", [(0, 10.0, 0.3), (20, 50.0, 0.5)], 52.0),
    ]
    fair_table(rows, ["trl", "ahead", "worker"])
    out = capsys.readouterr().out
    assert "| TRL | 1 | 0.200 | 0.850 | 10, 30.0 | 10, 30.0 | 42.0 |".replace("TRL", "trl") in out
    assert "| ahead | 20 | 0.80 | 0.80 | 0.67 |" in out  # 24 s / TRL's 30 s; wall 28 / 42
    assert "| worker | not reached | not reached | not reached | 1.24 |" in out
    assert "0.300 (≠ TRL's: the evaluators differ)" in out  # the same warm start must score the same
