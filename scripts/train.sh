#!/usr/bin/env bash
# From a bare clone: create .venv (torch 2.13.0 CPU first), install roll_lite, and run the embedded
# CPU default (PPO on the digit-reversal task). Extra arguments are config overrides (key=value).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
. .venv/bin/activate
roll-train --config configs/ppo.yaml "$@"
