"""benchmarks/cuda_check.py is the check a GPU box runs; CI has no GPU, so keep the script itself
working: its --smoke mode runs every section at tiny sizes on CPU (exact per-sequence path only).
`python benchmarks/cuda_check.py --smoke`, forked where the imports of torch and transformers are done
(tests/forked_main.py): ~5 CPU s less than a new interpreter."""

from pathlib import Path

from forked_main import run_as_main

ROOT = Path(__file__).resolve().parents[1]


def test_cuda_check_runs_in_smoke_mode():
    result = run_as_main([str(ROOT / "benchmarks" / "cuda_check.py"), "--smoke"], cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "packed attention for bfloat16: per-sequence-sdpa (not flash-attn: device is cpu" in out
    # float32 per-sequence sdpa against float64 attention: a real comparison, not a formality.
    kernel_row = next(line for line in out.splitlines() if line.startswith("| per-sequence-sdpa | float32"))
    assert all(float(x) < 1e-5 for x in kernel_row.strip("| ").split(" | ")[2:])
    strategy_rows = [
        line for line in out.splitlines() if line.startswith("| float32 |")
    ]  # 2 micro-batchings × actor/critic × 4 modes
    assert len(strategy_rows) == 16 and all(float(row.split(" | ")[-1].strip(" |")) < 1e-4 for row in strategy_rows)
    assert "| packed, per-sequence-sdpa |" in out
