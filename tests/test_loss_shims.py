"""The loss code moved into the roll_lite.loss package; the old module paths still work, and warn
naming the new one. The repository itself imports only the new paths."""

import importlib
import subprocess
import sys
import types

import pytest

from test_house import REPO, imported_names, python_files, relative

OLD_TO_NEW = {
    "roll_lite.loss_funcs": "roll_lite.loss",
    "roll_lite.algorithms": "roll_lite.loss.advantages",
    "roll_lite.loss_checks": "roll_lite.loss.checks",
    "roll_lite.invariance": "roll_lite.loss.checker",
}


@pytest.mark.parametrize("old, new", OLD_TO_NEW.items())
def test_an_old_module_warns_naming_the_new_one_and_gives_the_same_objects(old, new, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)  # a fresh import: a module warns when it is imported
    with pytest.warns(DeprecationWarning, match=rf"^{old} is deprecated: import .*from {new}\b") as record:
        __import__(old)  # as an import statement does (importlib.import_module would be the importing frame)
    shim = sys.modules[old]
    assert {warning.filename for warning in record} == {__file__}  # points at the importing line
    target = importlib.import_module(new)
    names = [name for name, value in vars(shim).items()
             if not name.startswith("_") and not isinstance(value, types.ModuleType)]
    assert len(names) >= 10
    assert [name for name in names if getattr(target, name, None) is not getattr(shim, name)] == []


def test_old_user_imports_still_work():
    from roll_lite.algorithms import grpo_advantages  # noqa: F401
    from roll_lite.invariance import check_loss_invariance, random_rl_batch  # noqa: F401
    from roll_lite.loss import agg_loss, mask_stats, ppo_clipped_loss, zero_outside  # noqa: F401
    from roll_lite.loss_funcs import BUILTIN_LOSSES, old_log_probs, ppo_policy_loss_func, rollout_correction  # noqa: F401

    assert ppo_policy_loss_func.__module__ == "roll_lite.loss.policy"


def test_the_new_paths_do_not_warn():
    code = ("import warnings; warnings.simplefilter('error', DeprecationWarning); "
            "import roll_lite.loss, roll_lite.loss.advantages, roll_lite.loss.checks, roll_lite.loss.checker")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_python_m_runs_the_checker_by_its_old_and_new_name():
    for module in ("roll_lite.loss.checker", "roll_lite.invariance"):
        result = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0 and result.stdout.startswith("usage: roll-check-loss"), result.stderr[-2000:]
    assert "roll_lite.invariance is deprecated" in result.stderr


def test_the_repository_imports_no_deprecated_module():
    shims = {f"roll_lite/{old.split('.')[1]}.py" for old in OLD_TO_NEW} | {relative(REPO / "tests" / "test_loss_shims.py")}
    found = [f"{relative(path)}:{line} imports {name}"
             for folder in ("roll_lite", "pipelines", "workers", "tests", "benchmarks", "examples")
             for path in python_files(folder) if relative(path) not in shims
             for name, line in imported_names("", path)
             if any(name == old or name.startswith(old + ".") for old in OLD_TO_NEW)]
    assert not found, f"import the new paths (see OLD_TO_NEW): {found}"
