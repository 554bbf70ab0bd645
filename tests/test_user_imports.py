"""A user's `package.module:attribute` is found from the current directory, as `python -m` finds it,
but after the installed packages: by roll-check-loss, by roll-train and by its Ray workers, and a
roll_lite checkout in that directory never replaces (or mixes with) the installed roll_lite.

The console scripts are run from the venv's bin, as a user runs them. Two tests start Ray (a 1-step
run each); the rest take milliseconds to seconds.
"""

import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import doc_commands
import pytest
from test_pipeline_ray import small

from roll_lite.runtime.importing import enter_import_root, load_object, roll_lite_dir

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ROLL_LITE = Path(roll_lite_dir())  # the installed tree: an editable install points into this checkout
INSTALLED_TREE = ROLL_LITE.parent if (ROLL_LITE.parent / "workers").is_dir() else ROLL_LITE


def one_step(tmp_path: Path) -> list[str]:
    """Keeps the README's training command to one short step (the README runs 200): a tiny model, no
    SFT, 200 of the demo's rows and 8 eval prompts by absolute path (these runs start in other directories)."""
    return [*small(tmp_path), "steps=1", "eval_every=1", "save_model=false", "wandb_mode=disabled"]


def readme_commands(program: str) -> list[str]:
    """Command lines starting with `program` in README.md and docs/: in fenced code blocks and in `inline` code."""
    return doc_commands.commands(program, inline=True)


def readme_command(program: str, contains: str) -> list[str]:
    found = [c for c in readme_commands(program) if contains in c]
    assert found, f"README.md / docs no longer show a `{program} ...{contains}...` command"
    argv = shlex.split(found[0])
    return [str(BIN / argv[0]), *argv[1:]]


def run(argv, cwd, timeout=120, **kwargs):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only what the user's shell would have
    return subprocess.run(
        argv,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**env, "RAY_AUTH_MODE": "disabled"},
        **kwargs,
    )


def test_readme_commands_are_found():
    assert readme_command("roll-check-loss", "examples.custom_loss")[1:] == [
        "examples.custom_loss.pipeline:capped_loss"
    ]
    assert readme_command("roll-train", "examples/custom_loss")[1:] == ["--config", "examples/custom_loss/config.yaml"]


def test_readme_check_loss_command_passes_from_the_repo_root():
    result = run(readme_command("roll-check-loss", "examples.custom_loss"), cwd=REPO)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "PASS" in result.stdout


def test_readme_training_command_runs_from_the_repo_root(tmp_path):
    # The README's command verbatim, plus overrides that keep it to one tiny step (see one_step), in one process
    # (workers.backend=local: the loss_func runs as on Ray; Ray's workers importing the user's code from its
    # directory are the next tests')
    command = (
        readme_command("roll-train", "examples/custom_loss")
        + one_step(tmp_path)
        + [f"output_dir={tmp_path}", "run_name=readme", "workers.backend=local"]
    )
    result = run(command, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    config_text = (tmp_path / "readme" / "config.yaml").read_text()
    assert "pipeline: examples.custom_loss.pipeline:CappedAdvantagePipeline" in config_text
    records = [json.loads(line) for line in (tmp_path / "readme" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1]
    assert records[1]["actor/grad_norm"] > 0  # the actor workers ran the example's loss_func


USER_MODULE = '''
import json, os, sys
from pathlib import Path

import roll_lite
from roll_lite.loss import ppo_policy_loss_func
from roll_lite.pipelines.ppo import PPOPipeline

policy_loss = ppo_policy_loss_func("token-mean")


def where_imported():
    """Every roll_lite module this process has imported, and sys.path."""
    modules = {name: module.__file__ for name, module in list(sys.modules.items())
               if (name == "roll_lite" or name.startswith("roll_lite.")) and getattr(module, "__file__", None)}
    return {"pid": os.getpid(), "modules": modules, "sys_path": sys.path, "usermod": __file__}


print("USERMOD " + json.dumps(where_imported()))


class Pipeline(PPOPipeline):
    """Built by the driver and by each model worker: each writes where its imports came from."""

    def __init__(self, config):
        super().__init__(config)
        (Path(config.output_dir) / f"imports-{os.getpid()}.json").write_text(json.dumps(where_imported()))
'''


@pytest.fixture
def second_checkout(tmp_path):
    """A directory outside the repository holding the user's module and a roll_lite checkout of its own."""
    directory = tmp_path / "checkout"
    (directory / "roll_lite" / "strategy").mkdir(parents=True)
    (directory / "roll_lite" / "__init__.py").write_text("__version__ = 'another checkout'\n")
    (directory / "roll_lite" / "strategy" / "__init__.py").write_text("")
    (directory / "usermod.py").write_text(textwrap.dedent(USER_MODULE))
    return directory


def assert_installed_tree_only(record, user_dir):
    fake = str(user_dir / "roll_lite")
    assert record["modules"]["roll_lite"] == str(ROLL_LITE / "__init__.py")
    assert "roll_lite.strategy" in record["modules"]
    strays = {name: file for name, file in record["modules"].items() if not file.startswith(str(INSTALLED_TREE))}
    assert not strays, f"not from the installed tree {INSTALLED_TREE}: {strays}"
    assert not any(file.startswith(fake) for file in record["modules"].values())
    assert Path(record["usermod"]) == user_dir / "usermod.py"
    # the user's directory is searched after the installed packages
    site = next(i for i, p in enumerate(record["sys_path"]) if p.endswith("site-packages"))
    assert max(i for i, p in enumerate(record["sys_path"]) if p == str(user_dir)) > site, record["sys_path"]


def test_check_loss_imports_a_user_module_from_its_directory_never_its_roll_lite(second_checkout):
    result = run([str(BIN / "roll-check-loss"), "usermod:policy_loss"], cwd=second_checkout)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "PASS" in result.stdout
    assert_installed_tree_only(json.loads(result.stdout.split("USERMOD ", 1)[1].splitlines()[0]), second_checkout)
    assert f"{second_checkout / 'roll_lite'} is not used" in result.stderr  # not silent either


def test_roll_train_and_its_ray_workers_import_a_user_pipeline_from_its_directory(second_checkout, tmp_path):
    output = tmp_path / "out"
    output.mkdir()
    command = [
        str(BIN / "roll-train"),
        "--config",
        str(REPO / "configs/grpo.yaml"),
        "pipeline=usermod:Pipeline",
        *one_step(tmp_path),
        f"output_dir={output}",
        "run_name=user",
        "workers.backend=ray",  # its Ray workers' imports are what it checks
    ]
    result = run(command, cwd=second_checkout, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [json.loads(path.read_text()) for path in output.glob("imports-*.json")]
    driver = json.loads(result.stdout.split("USERMOD ", 1)[1].splitlines()[0])["pid"]
    workers = [r for r in records if r["pid"] != driver]
    assert workers and len(records) == len(workers) + 1, [r["pid"] for r in records]
    for record in records:
        assert_installed_tree_only(record, second_checkout)


def test_a_missing_module_is_one_line_naming_the_spec_and_where_it_looked(tmp_path, monkeypatch, capsys):
    from roll_lite.loss.checker import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["nowhere_pkg.losses:my_loss"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "cannot import 'nowhere_pkg.losses:my_loss': no module named 'nowhere_pkg'" in error
    assert str(tmp_path) in error and "PYTHONPATH" in error


def test_the_current_directory_comes_after_the_installed_packages(tmp_path, monkeypatch):
    (tmp_path / "cwd_pkg_for_test").mkdir()
    (tmp_path / "cwd_pkg_for_test" / "__init__.py").write_text("")
    (tmp_path / "cwd_pkg_for_test" / "losses.py").write_text("def my_loss(batch, output):\n    return 0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    with pytest.raises(ModuleNotFoundError, match="no module named 'cwd_pkg_for_test' in sys.path"):
        load_object("cwd_pkg_for_test.losses:my_loss")  # as in a worker: the current directory is not searched
    loss = load_object("cwd_pkg_for_test.losses:my_loss", search_cwd=True)
    assert loss.__module__ == "cwd_pkg_for_test.losses" and sys.path[-1] == str(tmp_path)


def test_a_user_package_named_like_an_installed_one_is_reported(tmp_path, monkeypatch):
    (tmp_path / "yaml").mkdir()  # PyYAML is installed (omegaconf needs it)
    (tmp_path / "yaml" / "__init__.py").write_text("")
    (tmp_path / "yaml" / "my_losses.py").write_text("def my_loss(batch, output):\n    return 0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(ImportError, match=r"'yaml' is .*site-packages/yaml, which hides .*yaml; rename your package"):
        load_object("yaml.my_losses:my_loss", search_cwd=True)


def test_a_worker_refuses_a_second_roll_lite_tree_in_the_drivers_import_root(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    other = tmp_path / "roll_lite"
    other.mkdir()
    (other / "__init__.py").write_text("")
    # The driver ran the checkout in its import root, this worker runs another tree: refuse.
    with pytest.raises(ImportError, match="two roll_lite trees would be mixed"):
        enter_import_root(str(tmp_path), str(other))
    # This worker imported the import root's roll_lite, the driver another one: refuse.
    with pytest.raises(ImportError, match="two roll_lite trees would be mixed"):
        enter_import_root(str(ROLL_LITE.parent), str(other))
    # Same tree as the driver: the root is only appended, after the installed packages.
    sys.path.insert(0, str(tmp_path))  # where Ray puts the driver's directory
    enter_import_root(str(tmp_path), str(ROLL_LITE))
    assert sys.path.count(str(tmp_path)) == 1 and sys.path[-1] == str(tmp_path)


def test_roll_lite_pipelines_from_one_tree_and_roll_lite_from_another_fail_loudly(second_checkout):
    # `python -m` (or PYTHONPATH) puts a checkout's roll_lite first; the editable install maps
    # roll_lite.pipelines to the installed tree. Mixing them must fail, naming both.
    result = subprocess.run(
        [sys.executable, "-c", "import roll_lite.pipelines"],
        cwd=second_checkout,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(second_checkout)},
    )
    if "No module named 'roll_lite.pipelines'" in result.stderr:
        pytest.skip("a non-editable install: roll_lite.pipelines cannot come from another tree")
    assert result.returncode != 0
    assert f"but roll_lite from {second_checkout / 'roll_lite'}: two roll_lite trees are mixed" in result.stderr
