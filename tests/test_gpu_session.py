"""scripts/gpu_session.py: every roll-train command it would run on a lent GPU passes the config's
checks here first (a wrong key costs minutes of device time there), and --list names every section."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import gpu_session  # noqa: E402

from pipelines.preflight import check_run  # noqa: E402
from roll_lite.config import ConfigError, load_config  # noqa: E402


def roll_train_commands() -> list[tuple[str, list[str]]]:
    commands = []
    for section in gpu_session.SECTIONS:
        for part in re.split(r"&&|;|[{}]|\n", section.command):
            words = shlex.split(part) if "--config" in part else []
            if words:
                at = words.index("--config")
                commands.append((words[at + 1], [w for w in words[at + 2 :] if "=" in w and not w.startswith("-")]))
    return commands


def test_there_are_roll_train_commands_to_check():
    configs = [config for config, _ in roll_train_commands()]
    assert "configs/grpo_gpu.yaml" in configs and "configs/grpo_async.yaml" in configs and len(configs) >= 8


@pytest.mark.parametrize("config, overrides", roll_train_commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_each_roll_train_command_passes_the_checks_before_a_run(monkeypatch, config, overrides):
    monkeypatch.chdir(REPO)
    cpu = [o for o in overrides if not o.startswith("workers.gpus_per_rank=")] + ["workers.gpus_per_rank=0"]
    try:
        run_config = load_config(config, cpu)
    except ConfigError as error:  # a folder an earlier command of its chain writes on the machine
        assert "outputs/" in str(error), error
        return
    if run_config.pipeline.endswith(":PPOPipeline") or "pipelines.ppo" in run_config.pipeline:
        check_run(run_config)  # the model's positions against the lengths, the engine, the CPUs


def test_list_names_every_section():
    listed = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_session.py"), "--list"], capture_output=True, text=True, check=True
    ).stdout
    for section in gpu_session.SECTIONS:
        assert f"{section.name} ({section.seconds} s)" in listed
