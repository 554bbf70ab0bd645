"""The shipped configs that start from another shipped run's output, run first, stop with one line
naming the missing folder and, last, the command that writes it, the one their header comment shows
(roll_lite/runtime/shipped_runs.py). In-process, from a directory without outputs/: the error comes
before Ray or any run directory."""

import shlex
from pathlib import Path

import pytest

from roll_lite.cli import main
from roll_lite.config import load_config
from roll_lite.runtime.shipped_runs import command_that_writes

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh_checkout(tmp_path, monkeypatch):
    """The repository's configs and data (the configs' relative paths), no outputs/, as the current directory."""
    for name in ("configs", "data"):
        (tmp_path / name).symlink_to(REPO / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    "config, missing",
    [
        ("dpo.yaml", "outputs/sft_reverse_digits/final"),  # model.pretrained_path
        ("distill.yaml", "outputs/grpo_reverse_digits/final"),  # distill.teacher
        ("mixed_domains.yaml", "outputs/rm_increment/final"),  # a domain's reward model (its judge comes next)
    ],
)
def test_a_config_run_before_its_prerequisite_names_the_command_that_makes_it(fresh_checkout, capsys, config, missing):
    assert main(["--config", f"configs/{config}"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and error.startswith("roll-train: config error: ")
    assert f"no such folder '{missing}'" in error
    shown, _, command = error.partition("; to make it, run first: ")
    assert command, error
    assert command in (REPO / "configs" / config).read_text()  # as the config's header comment shows it
    words = shlex.split(command)
    made = load_config(words[2], words[3:])  # that command's run writes the missing folder
    assert Path(made.output_dir) / made.run_name / "final" == Path(missing)
    assert not (fresh_checkout / "outputs").exists()


def test_only_what_a_shipped_run_writes_gets_a_command():
    sft = "roll-train --config configs/sft.yaml"
    for written in (
        "outputs/sft_reverse_digits",
        "outputs/sft_reverse_digits/final",
        "outputs/sft_reverse_digits/checkpoints/step_600",
    ):
        assert command_that_writes(written) == sft
    for other in ("outputs/sft_reverse_digits/fianl", "outputs/sft_reverse_digit/final", "models/mine"):
        assert command_that_writes(other) is None
    assert command_that_writes("outputs/judge_decrement/final").startswith(
        "roll-train --config configs/sft.yaml run_name=judge_decrement "
    )
