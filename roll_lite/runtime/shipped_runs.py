"""Which shipped config's run writes a folder: what an error about a missing folder (a model, a
teacher, a reward model, a checkpoint) adds when that folder is the output of a run the repository
ships, e.g. configs/dpo.yaml's model.pretrained_path, outputs/sft_reverse_digits/final, is written by
`roll-train --config configs/sft.yaml`.

Derived from the shipped configs themselves (configs/*.yaml of a source checkout; an installed
wheel has none, and then no error names a command): each config's run folder (its output_dir /
run_name), and the commands their header comments show (`#   roll-train --config configs/X.yaml
run_name=Y ...`), whose run_name= / output_dir= overrides name other run folders (configs/
mixed_domains.yaml's reward model and judge). Like those comments, the commands run from the
repository root.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
from pathlib import Path

import yaml

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SHOWN_COMMAND = re.compile(r"#\s+(roll-train --config (\S+)(.*))")
DEFAULT_OUTPUT_DIR = "outputs"  # RunConfig.output_dir's default (the runtime package does not import the config's)


@functools.cache
def shipped_runs(configs: Path = CONFIGS) -> dict[Path, str]:
    """{run folder, relative to where roll-train runs: the shortest command that writes it}."""
    own = {path.name: _run_keys(path) for path in sorted(configs.glob("*.yaml"))} if configs.is_dir() else {}
    commands = [f"roll-train --config configs/{name}" for name in own]
    for path in sorted(configs.glob("*.yaml")) if configs.is_dir() else []:
        for line in path.read_text().splitlines():
            if (shown := SHOWN_COMMAND.fullmatch(line.strip())) is not None:
                commands.append(shown[1].split(" # ")[0].strip())
    runs: dict[Path, str] = {}
    for command in commands:
        words = shlex.split(command)
        keys = own.get(Path(words[2]).name)
        if keys is None:  # a config the repository does not ship
            continue
        overrides = dict(word.split("=", 1) for word in words[3:] if "=" in word)
        run_name = overrides.get("run_name", keys.get("run_name"))
        if run_name is None:  # the schema's default run_name: not this config's own folder
            continue
        folder = Path(overrides.get("output_dir", keys.get("output_dir", DEFAULT_OUTPUT_DIR))) / run_name
        if folder not in runs or len(command) < len(runs[folder]):
            runs[folder] = command
    return runs


def _run_keys(path: Path) -> dict:
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return {}
    return {key: loaded[key] for key in ("run_name", "output_dir") if isinstance(loaded, dict) and key in loaded}


def command_that_writes(path: str) -> str | None:
    """The command of the shipped run that writes `path` (its run folder, its final/, its checkpoints/ or
    a checkpoint in it), or None."""
    target = Path(os.path.abspath(os.path.expanduser(path)))
    for folder, command in shipped_runs().items():
        run_dir = Path(os.path.abspath(folder))
        if target in (run_dir, run_dir / "final") or target.is_relative_to(run_dir / "checkpoints"):
            return command
    return None


def written_by(path: str) -> str:
    """The end of a "no such folder" error: the command of the shipped run that writes `path`, last on
    the line to copy as it is ('' when no shipped run writes it)."""
    command = command_that_writes(path)
    return f"; to make it, run first: {command}" if command is not None else ""
