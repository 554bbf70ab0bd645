import subprocess
import sys


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
