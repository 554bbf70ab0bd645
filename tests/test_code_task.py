"""The embedded code task (data/integer_functions/, configs/code.yaml): the shipped files are the
generator's output, held-out functions never appear in training, every reference program passes its
own hidden cases in the sandbox, and the demonstrator mixes the right program with the simpler x+b."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from roll_lite.data.integer_functions import functions, integer_function_rows, program, write_integer_functions
from roll_lite.sandbox import Isolation, Limits, SandboxPool, judge, parse_tests

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data/integer_functions"


def shipped(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines()]


def test_the_shipped_files_are_the_generators_output(tmp_path):
    write_integer_functions(tmp_path)
    for name in ("train.jsonl", "eval.jsonl"):
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name


def test_held_out_functions_are_never_trained_on_and_the_demonstrator_is_noisy():
    train, evaluation = shipped("train.jsonl"), shipped("eval.jsonl")
    assert len(evaluation) == 24 and len({row["answer"] for row in evaluation}) == 24
    assert not {row["answer"] for row in evaluation} & {row["answer"] for row in train}
    assert len({row["answer"] for row in train}) == len(functions()) - 24
    simpler = [row for row in train if row["demonstration"] != row["answer"]]
    assert all(row["demonstration"] == program(1, offset(row)) for row in simpler)
    right = 1 - len(simpler) / len(train)  # 0.35, plus the a = 1 rows the simpler program gets right
    assert 0.37 < right < 0.47, right
    with pytest.raises(ValueError, match="num_eval must be in 1.."):
        integer_function_rows(num_eval=len(functions()))


def offset(row: dict) -> int:
    return int(row["prompt"].split(",")[0].removeprefix("f(0)="))


def test_every_programs_text_and_prompt_agree():
    for row in shipped("eval.jsonl"):
        namespace: dict = {}
        exec(row["answer"], namespace)
        shown = ",".join(f"f({x})={namespace['f'](x)}" for x in (0, 10, 100)) + ":"
        assert shown == row["prompt"], row


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_every_held_out_reference_program_passes_in_the_sandbox_and_the_simpler_one_does_not():
    rows = shipped("eval.jsonl")
    pool = SandboxPool(Isolation("bwrap"), Limits(wall_s=5, cpu_s=3), workers=2)
    try:
        right = pool.map(lambda row: judge(pool, row["answer"], parse_tests(row["tests"])), rows)
        simpler = pool.map(lambda row: judge(pool, program(1, offset(row)), parse_tests(row["tests"])), rows)
    finally:
        pool.close()
    assert all(v.verdict == "passed" for v in right), [v for v in right if v.verdict != "passed"]
    for row, verdict in zip(rows, simpler):
        assert (verdict.verdict == "passed") == (row["answer"] == program(1, offset(row))), (row, verdict)


def test_the_code_config_loads_and_every_row_of_its_data_passes_the_tests_check():
    """configs/code.yaml as `roll-train --config configs/code.yaml` reads it: valid, and its data
    through the same row check the pipeline runs before a step (the run itself: docs/benchmarks.md)."""
    from roll_lite.config import load_config
    from roll_lite.data.prompts import prepare_datasets
    from roll_lite.model.tokenizer import build_char_tokenizer
    from roll_lite.rewards.code import code_row_check

    config = load_config(
        REPO / "configs/code.yaml",
        [f"data.train_files={DATA / 'train.jsonl'}", f"data.eval_files={DATA / 'eval.jsonl'}"],
    )
    assert config.reward.code == 1.0 and config.reward.in_driver is False and config.data.extra_keys == ["tests"]
    prepared = prepare_datasets(
        config.data, build_char_tokenizer(), row_check=code_row_check(config.reward, config.data.domain_key)
    )
    assert len(prepared.train) == 4000 and len(prepared.eval) == 24
