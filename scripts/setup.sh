#!/usr/bin/env bash
# Create .venv and install roll_lite for CPU: torch 2.13.0 first (the local CPU wheel),
# then the project with a constraints file so nothing can pull a newer torch + CUDA.
# Usage: bash scripts/setup.sh [extras]   (default extras: dev)
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev}"
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0
python -m pip install -q -c constraints-cpu.txt -e ".[${extras}]"
python -c "import torch, transformers; print(f'roll_lite env ready: torch {torch.__version__}, transformers {transformers.__version__}')"
