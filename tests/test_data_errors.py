"""roll-train on bad data: one line naming the config key, the file, the row and the field; exit
code 2; nothing started (no run directory), checked in the driver before Ray starts.

The cases call roll-train's main() in this process (the same code path, without a process start
each); one case runs the real command to check what a user sees."""

import subprocess
import sys

import pytest

from roll_lite.cli import main

GOOD = '{"prompt": "12=", "answer": "21"}\n'


def command_line(tmp_path, *overrides) -> list[str]:
    (tmp_path / "config.yaml").write_text("steps: 1\n")
    return ["--config", "config.yaml", f"output_dir={tmp_path / 'out'}", *overrides]


CASES = {
    "missing file": ({}, ["data.train_files=nope.jsonl"], "data.train_files: no such file or folder 'nope.jsonl'"),
    "unknown format": (
        {"train.csv": "prompt,answer\n12=,21\n"},
        ["data.train_files=train.csv"],
        "data.train_files: 'train.csv': unknown format '.csv' (use .jsonl, .json, .parquet, or a folder written by "
        "Dataset.save_to_disk)",
    ),
    "missing prompt": (
        {"train.jsonl": GOOD + '{"question": "34=", "answer": "43"}\n'},
        ["data.train_files=train.jsonl"],
        "data.train_files: train.jsonl: row 1 (line 2): key 'prompt' (data.prompt_key) is missing or null",
    ),
    "missing answer column": (
        {"train.jsonl": '{"prompt": "12=", "solution": "21"}\n'},
        ["data.train_files=train.jsonl"],
        "data.train_files: train.jsonl: row 0 (line 1): key 'answer' (data.answer_key) is missing; the file's "
        "columns: prompt, solution",
    ),
    "empty prompt": (
        {"train.jsonl": GOOD + "\n" + GOOD + '{"prompt": "  ", "answer": "x"}\n'},
        ["data.train_files=train.jsonl"],
        "data.train_files: train.jsonl: row 2 (line 4): key 'prompt': the prompt is empty",
    ),
    "non-UTF-8 bytes": (
        {"train.jsonl": (GOOD + GOOD + '{"prompt": "1\xe9=", "answer": "x"}\n').encode("latin-1")},
        ["data.train_files=train.jsonl"],
        "data.train_files: train.jsonl: line 3 (row 2): byte 0xe9 at column 14 is not UTF-8 (save the file as UTF-8)",
    ),
    "not JSON": (
        {"train.jsonl": GOOD + '{"prompt": "3=", "answer": }\n'},
        ["data.train_files=train.jsonl"],
        "data.train_files: train.jsonl: line 2 (row 1): not valid JSON: Expecting value at column 28",
    ),
    "unterminated string": (  # json's message ends in "starting at": the column follows it once
        {"train.jsonl": GOOD + '{"prompt": "3=}\n'},
        ["data.train_files=train.jsonl"],
        "data.train_files: train.jsonl: line 2 (row 1): not valid JSON: Unterminated string starting at column 12",
    ),
    "every prompt too long": (
        {"train.jsonl": GOOD + '{"prompt": "1234=", "answer": "4321"}\n'},
        ["data.train_files=train.jsonl", "data.max_prompt_length=3"],
        "data.train_files: train.jsonl: row 0 (line 1): key 'prompt': every prompt is longer than "
        "data.max_prompt_length=3 tokens; the shortest, this one, has 4",
    ),
    "bad eval file": (
        {"train.jsonl": GOOD, "eval.jsonl": '{"prompt": "12="}\n'},
        ["data.train_files=train.jsonl", "data.eval_files=eval.jsonl"],
        "data.eval_files: eval.jsonl: row 0 (line 1): key 'answer' (data.answer_key) is missing; the file's columns: prompt",
    ),
    "missing image": (
        {
            "train.jsonl": '{"prompt": [{"role": "user", "content": [{"type": "image"}]}], "answer": "1", "im": "a.png"}\n'
        },
        ["data.train_files=train.jsonl", "data.image_key=im"],
        "data.train_files: train.jsonl: row 0 (line 1): key 'im': image 0: no such image file 'a.png'",
    ),
    "corrupt image": (
        {
            "train.jsonl": '{"prompt": [{"role": "user", "content": [{"type": "image"}]}], "answer": "1", "im": "a.png"}\n',
            "a.png": b"\x89PNG not really",
        },
        ["data.train_files=train.jsonl", "data.image_key=im"],
        "data.train_files: train.jsonl: row 0 (line 1): key 'im': image 0: the image file 'a.png' cannot be read as an "
        "image (cannot identify image file 'a.png')",
    ),
    "no training file": (
        {},
        [],
        "data.train_files: no training file given (a .jsonl, .json, .parquet file or a saved dataset folder)",
    ),
}


def write_files(tmp_path, files: dict) -> None:
    for name, content in files.items():
        (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())


@pytest.mark.parametrize("case", CASES)
def test_bad_data_exits_2_with_one_line_and_starts_nothing(tmp_path, monkeypatch, capsys, case):
    files, overrides, expected = CASES[case]
    write_files(tmp_path, files)
    monkeypatch.chdir(tmp_path)  # the config's paths are relative to where roll-train runs
    assert main(command_line(tmp_path, *overrides)) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"roll-train: data error: {expected}"]
    assert not (tmp_path / "out").exists()
    assert "ray" not in sys.modules or not __import__("ray").is_initialized()


def test_the_command_itself_prints_one_line_and_exits_2(tmp_path):
    files, overrides, expected = CASES["missing prompt"]
    write_files(tmp_path, files)
    result = subprocess.run(
        [sys.executable, "-m", "roll_lite.cli", *command_line(tmp_path, *overrides)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [f"roll-train: data error: {expected}"]
    assert not (tmp_path / "out").exists()
