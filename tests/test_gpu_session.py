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


def test_a_section_that_fails_or_outlasts_its_limit_is_named_so_and_the_session_goes_on(tmp_path, monkeypatch):
    # sections outside the run folder: no `ray stop --force` after them (it would stop every Ray cluster here)
    sections = (
        gpu_session.Section("fails", 30, "echo before; exit 3"),
        gpu_session.Section("hangs", 1, "echo started; sleep 60"),
        gpu_session.Section("passes", 30, "echo fine"),
    )
    monkeypatch.setattr(gpu_session, "SECTIONS", sections)
    monkeypatch.setattr(sys, "argv", ["gpu_session.py", "--out", str(tmp_path), "--deadline", "60"])
    with pytest.raises(SystemExit) as exit_:
        gpu_session.main()
    assert exit_.value.code == 1  # not every section was ok
    summary = (tmp_path / "summary.md").read_text().splitlines()[2:]
    assert [line.split(" | ")[1].split(" in ")[0] for line in summary] == ["failed (exit 3)", "out of time", "ok"]
    log = (tmp_path / "session.log").read_text()
    assert "before" in log and "started" in log and "fine" in log  # each section's output, in the one log
