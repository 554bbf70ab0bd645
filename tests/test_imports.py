import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_import_roll_lite_stays_light():
    code = (
        "import sys, roll_lite, roll_lite.data, roll_lite.loss, roll_lite.strategy, roll_lite.pipelines, roll_lite.workers;"
        "heavy = [m for m in ('ray', 'vllm', 'flash_attn', 'math_verify', 'datasets') if m in sys.modules]; print(heavy); assert not heavy"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_pipelines_and_workers_install_under_roll_lite():
    import roll_lite.pipelines
    import roll_lite.workers

    assert roll_lite.pipelines.__file__.endswith("pipelines/__init__.py")
    assert roll_lite.workers.__file__.endswith("workers/__init__.py")


def test_the_driver_imports_no_model_classes():
    """roll-train's driver (its modules, the worker classes, the preflight checks of a built model)
    imports none of transformers' model classes: ~1 s of CPU per run that only the workers need."""
    code = (
        "import sys; import roll_lite.cli, roll_lite.workers.group; from roll_lite.config import load_config; "
        "from roll_lite.pipelines.preflight import check_run; check_run(load_config('configs/ppo.yaml', []));"
        "heavy = [m for m in ('transformers.models.auto.modeling_auto', 'transformers.masking_utils', "
        "'transformers.models.qwen2.configuration_qwen2') if m in sys.modules]; print(heavy); assert not heavy"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_judge_parser_module_imports_no_torch():
    """The judge's guarded child imports its parser's module (configs/mixed_domains.yaml:
    roll_lite.data.digit_domains:parse_verdict); through roll_lite.data's DataProto that pulled torch,
    ~1 s of CPU at every start and restart of the child instead of ~0.07 s."""
    code = (
        "import sys, roll_lite.rewards.judge_code, roll_lite.rewards.guarded, roll_lite.data.digit_domains;"
        "heavy = [m for m in ('torch', 'transformers', 'datasets') if m in sys.modules]; print(heavy); assert not heavy;"
        "from roll_lite.data import DataProto; assert DataProto.__module__ == 'roll_lite.data.proto'"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
