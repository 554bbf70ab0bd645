"""The short forms of docs/getting-started.md ("Short runs"): every shipped RL config has one (or the table
says why not), each is a command benchmarks/short_forms.py can run verbatim, and the GRPO one, run as the
docs give it, shows a learning signal: rewards and gradients above 0. The other rows are run by the
benchmark (their figures in the docs), which costs about a minute of both cores each."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import short_forms  # noqa: E402

RL_CONFIGS = {path.name for path in (REPO / "configs").glob("*.yaml")} - {
    "sft.yaml",  # supervised, no reward
    "dpo.yaml",  # preference pairs, no reward
    "reward_model.yaml",  # trains a scorer
    "grpo_gpu.yaml",  # needs a GPU (the table says so)
    "grpo_gsm8k.yaml",  # needs a GPU and a model from the hub (the table says so)
}


def test_every_shipped_rl_config_has_a_short_form_or_says_why_not():
    docs = short_forms.section(REPO / "docs/getting-started.md", "## Short runs")
    with_command = {config for config, _ in short_forms.short_forms(REPO / "docs/getting-started.md")}
    for config in sorted(RL_CONFIGS):
        assert config in with_command or f"| `{config}` | none:" in docs, config
    for config in ("grpo_gpu.yaml", "grpo_gsm8k.yaml"):
        assert f"`{config}`" in docs
    for config, command in short_forms.short_forms(REPO / "docs/getting-started.md"):
        assert command.startswith("roll-train --config configs/") and "run_name=" in command, (config, command)


def test_the_mixed_domain_prerequisites_are_the_rewards_pages_commands():
    commands = short_forms.prerequisite_commands()
    assert [c.split("run_name=")[1].split()[0] for c in commands] == ["rm_increment", "judge_decrement"]


@pytest.fixture(scope="module")
def grpo_short_form():
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks/short_forms.py"), "--only", "grpo.yaml"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_the_grpo_short_form_shows_a_learning_signal(grpo_short_form):
    row = next(line for line in grpo_short_form if line.startswith("| `grpo.yaml`"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1] == "0", row
    rewarded, steps = (int(n) for n in cells[2].split(" of "))
    assert steps == 20 and rewarded >= 10, row  # measured: 19 of 20 (docs/getting-started.md)
    assert int(cells[3]) >= 10, row
    start, end = (float(x) for x in cells[5].split(" -> "))
    assert end > start, row
