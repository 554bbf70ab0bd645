"""The benchmarks the README and the docs quote exist and start; the cheap ones run on a tiny size."""

import re
import subprocess
import sys
from pathlib import Path

from doc_commands import doc_text

REPO = Path(__file__).resolve().parents[1]


def run(*args, timeout=120):
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_every_benchmark_the_docs_name_exists():
    named = set(re.findall(r"benchmarks/(\w+\.py)", doc_text()))
    assert {"vs_trl.py", "packed_attention.py", "logprob_memory.py", "vllm_cpu_check.py"} <= named
    assert not [name for name in named if not (REPO / "benchmarks" / name).is_file()]


def test_vs_trl_and_its_trl_side_parse_their_arguments_without_trl_installed():
    result = run("benchmarks/vs_trl.py", "--help")
    assert result.returncode == 0 and "--trl-threads" in result.stdout, result.stderr[-2000:]
    compiled = run("-m", "py_compile", "benchmarks/trl_grpo.py")  # it runs in TRL's own venv only
    assert compiled.returncode == 0, compiled.stderr


def test_vllm_cpu_check_starts_without_vllm():
    result = run("benchmarks/vllm_cpu_check.py", "--help")  # the checks themselves need its own venv (~350 MB)
    assert result.returncode == 0 and "load_weights" in result.stdout, result.stderr[-2000:]


def test_packed_attention_benchmark_gives_the_same_gradients_split_or_sliced():
    result = run("benchmarks/packed_attention.py", "--tokens", "256", "--sequences", "4", "16", "--repeats", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line for line in result.stdout.splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(rows) == 2 and all(row.rstrip(" |").endswith("0.0e+00") for row in rows), result.stdout


def test_one_rank_benchmark_trains_the_bare_model_and_fsdp2_to_the_same_weights():
    result = run("benchmarks/one_rank.py", "--batches", "2", "--rounds", "1", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "bit for bit: True" in result.stdout and "| FSDP2, one shard |" in result.stdout, result.stdout


def test_logprob_memory_benchmark_prints_a_row_per_use_of_the_head():
    result = run("benchmarks/logprob_memory.py", "--tokens", "64", "--chunk", "16", "--vocab", "2000", "--hidden", "32",
                 "--repeats", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| log-probs") or line.startswith("| entropy")]
    assert len(rows) == 3, result.stdout
    for row in rows:  # memory ratio and time ratio are numbers
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        float(cells[3]), float(cells[6])
