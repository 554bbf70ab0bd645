"""`reward.functions` in YAML files and overrides (keys with dots and a colon), and roll-train's
errors for a reward module that does not import: one line naming the key, exit code 2, nothing
started or written. The subprocess tests run the console script from the user's directory; most
error cases call its main() in this process."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from roll_lite.cli import main
from roll_lite.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A directory holding the user's package my_reward_pkg, made the current directory."""
    package = tmp_path / "my_reward_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "rewards.py").write_text(
        textwrap.dedent("""
        def score(response, ground_truth, extra):
            return float(response == ground_truth)

        def two_arguments(response, ground_truth):
            return 1.0
    """)
    )
    (package / "broken.py").write_text("ratio = 1 / 0\n\ndef score(response, ground_truth, extra):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("my_reward_pkg")]:
        del sys.modules[name]


def test_import_path_keys_survive_yaml_and_overrides_and_replace_the_default(user_dir):
    block = user_dir / "block.yaml"
    block.write_text("reward:\n  functions:\n    my_reward_pkg.rewards:score: 1.0\n    format: 0.1\n")
    flow = user_dir / "flow.yaml"
    flow.write_text("reward:\n  functions: {my_reward_pkg.rewards:score: 2.0}\n  timeout_s: 0.5\n")
    # The default {exact_answer: 1.0} is replaced, not merged into.
    assert load_config(block).reward.functions == {"my_reward_pkg.rewards:score": 1.0, "format": 0.1}
    config = load_config(flow)
    assert (config.reward.functions, config.reward.timeout_s) == ({"my_reward_pkg.rewards:score": 2.0}, 0.5)
    assert load_config(None, ["reward.functions={my_reward_pkg.rewards:score: 1.0}"]).reward.functions == {
        "my_reward_pkg.rewards:score": 1.0
    }
    # In order: braces replace, reward.functions.NAME=w sets one weight.
    assert load_config(flow, ["reward.functions.format=0.1"]).reward.functions == {
        "my_reward_pkg.rewards:score": 2.0,
        "format": 0.1,
    }
    assert load_config(None, ["reward.functions.format=0.1", "reward.functions={math: 1.0}"]).reward.functions == {
        "math": 1.0
    }
    assert load_config(None, ["reward.functions.format=0.1"]).reward.functions == {"exact_answer": 1.0, "format": 0.1}
    # Dots in a dotted override are path separators: say how to write it.
    with pytest.raises(
        ConfigError,
        match=r"^reward.functions.my_reward_pkg: the weight must be a finite number, got a mapping; "
        r"an import path as a key needs the braces: reward.functions=\{my_reward_pkg.rewards:score: 1.0\}$",
    ):
        load_config(None, ["reward.functions.my_reward_pkg.rewards:score=1.0"])


def test_cheap_built_in_rules_are_scored_in_the_driver_unless_told_otherwise(user_dir):
    """reward.in_driver: null picks the driver exactly when every function is a cheap built-in string
    rule; anything that runs in the guarded process (math, a user's function) needs a reward worker."""
    assert load_config(None, []).reward.in_driver is True  # {exact_answer: 1.0}
    assert load_config(None, ["reward.functions={format: 0.1, digits_only: 1.0}"]).reward.in_driver is True
    assert load_config(None, ["reward.functions={exact_answer: 1.0, math: 1.0}"]).reward.in_driver is False
    assert load_config(None, ["reward.functions={my_reward_pkg.rewards:score: 1.0}"]).reward.in_driver is False
    assert load_config(None, ["reward.in_driver=false"]).reward.in_driver is False
    with pytest.raises(
        ConfigError,
        match=r"^reward.in_driver: true scores only cheap built-in rules \(digits_only, "
        r"exact_answer, format, token_accuracy\) in the driver; "
        r"my_reward_pkg.rewards:score run\(s\) in the reward worker's guarded process",
    ):
        load_config(
            None, ["reward.functions={exact_answer: 1.0, my_reward_pkg.rewards:score: 1.0}", "reward.in_driver=true"]
        )


@pytest.mark.parametrize(
    "functions, expected",
    [
        (
            "{my_reward_pkg.broken:score: 1.0}",
            "reward.functions.my_reward_pkg.broken:score: cannot import 'my_reward_pkg.broken:score': "
            "ZeroDivisionError: division by zero",
        ),
        (
            "{nowhere_pkg.rewards:score: 1.0}",
            "reward.functions.nowhere_pkg.rewards:score: cannot import 'nowhere_pkg.rewards:score': no module named "
            "'nowhere_pkg' in the installed packages, then the current directory",
        ),
        (
            "{my_reward_pkg.rewards:nope: 1.0}",
            "reward.functions.my_reward_pkg.rewards:nope: cannot import 'my_reward_pkg.rewards:nope': "
            "my_reward_pkg.rewards has no attribute 'nope'",
        ),
        (
            "{my_reward_pkg.rewards:two_arguments: 1.0}",
            "reward.functions.my_reward_pkg.rewards:two_arguments: must take (response, ground_truth, extra), "
            "its signature is (response, ground_truth)",
        ),
        (
            "{exact_answer: 1.0, bleu: 0.5}",
            "reward.functions.bleu: 'bleu' is not one of digits_only, exact_answer, format, math, reasoning_gym, "
            "token_accuracy, nor a package.module:function import path",
        ),
    ],
)
def test_roll_train_reports_a_reward_that_does_not_import_in_one_line(
    user_dir, monkeypatch, capsys, functions, expected
):
    args = [
        "--config",
        str(REPO / "configs/grpo.yaml"),
        f"reward.functions={functions}",
        f"output_dir={user_dir / 'out'}",
    ]
    if "broken" in functions:  # the console script itself, from the user's directory
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        result = subprocess.run(
            [str(BIN / "roll-train"), *args], cwd=user_dir, capture_output=True, text=True, timeout=120, env=env
        )
        code, out, err = result.returncode, result.stdout, result.stderr
    else:  # its main() in this process: the same code path without a process start (~4 s) each
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        code = main(args)
        out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, err[-2000:]
    assert lines == [f"roll-train: config error: {expected}"] or (len(lines) == 1 and expected in lines[0]), lines
    assert not out and not (user_dir / "out").exists()  # nothing started, nothing written


def test_a_judge_template_jinja_cannot_parse_is_one_config_line_naming_the_file_and_lines(
    tmp_path, monkeypatch, capsys
):
    """It was jinja2's TemplateSyntaxError, raw, from the config check; the template's own line, and the
    config file's line where it is set."""
    config = tmp_path / "judged.yaml"
    config.write_text(
        "reward:\n"
        "  judges: {no_judge_here: 1.0}\n"
        "  judge_template: |\n"
        "    Answer: {{ answer }}\n"
        "    Response: {{ response }\n"
    )
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    template_error = "Jinja syntax error on line 2 of the template: unexpected '}'"
    for args, where in (
        ([], f"{config}:3"),
        (["reward.judge_template='{{ response }} {% if %}'"], "its key=value override"),
    ):
        code = main(["--config", str(config), f"output_dir={tmp_path / 'out'}", *args])
        out, err = capsys.readouterr()
        expected = (
            template_error if not args else "Jinja syntax error on line 1 of the template: Expected an expression"
        )
        assert code == 2 and not out and err.count("\n") == 1, err[-2000:]
        assert err.startswith(f"roll-train: config error: reward.judge_template ({where}): {expected}"), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "functions, written_right",
    [
        ("{exact_answer:1.0}", "{exact_answer: 1.0}"),
        (
            "{my_pkg.rewards:score:0.5, format: 0.1}",
            "{my_pkg.rewards:score: 0.5, format: 0.1}",
        ),  # the import path's colon stays
        ("{my_pkg.rewards:score}", "{my_pkg.rewards:score: 1.0}"),
    ],
)
def test_a_weight_without_a_space_after_the_colon_is_explained(tmp_path, functions, written_right):
    # YAML reads {exact_answer:1.0} as {'exact_answer:1.0': null}: a key without a weight.
    unweighted = functions.strip("{}").split(",")[0]
    with pytest.raises(ConfigError) as override_error:
        load_config(None, [f"reward.functions={functions}"])
    assert str(override_error.value) == (
        f"reward.functions: '{unweighted}' has no weight: YAML flow mappings need a space after the colon, "
        f"e.g. reward.functions={written_right} (quote the override in the shell: 'reward.functions={written_right}')"
    )
    config_file = tmp_path / "config.yaml"
    config_file.write_text(f"reward:\n  functions: {functions}\n")
    with pytest.raises(
        ConfigError,
        match=rf"^reward.functions: '{unweighted}' has no weight in {config_file}: YAML flow "
        rf"mappings need a space after the colon, e.g. functions: {re.escape(written_right)}$",
    ):
        load_config(config_file)
