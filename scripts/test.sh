#!/usr/bin/env bash
# From a bare clone: create .venv (torch 2.13.0 CPU first), install roll_lite[dev], run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
. .venv/bin/activate
python -m pytest "$@"
