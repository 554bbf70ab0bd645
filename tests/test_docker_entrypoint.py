"""The image's entry point (scripts/docker_entrypoint.sh) starts a Ray head, a worker node joining it, or
roll-train, with the arguments given; checked with stand-ins for `ray` and `roll-train` that print
what they were called with (no Docker engine on our machines: the image itself is not built)."""

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def entry(tmp_path, *args, env=None) -> str:
    for name in ("ray", "roll-train"):
        stand_in = tmp_path / name
        stand_in.write_text(f'#!/bin/sh\necho {name} "$@"\n')
        stand_in.chmod(0o755)
    result = subprocess.run(
        ["bash", str(REPO / "scripts/docker_entrypoint.sh"), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", **(env or {})},
    )
    assert result.returncode == 0 or args[:1] == ("worker",), result.stderr
    return (result.stdout + result.stderr).strip()


def test_head_worker_or_roll_train(tmp_path):
    assert entry(tmp_path, "head", "--num-gpus=8") == (
        "ray start --head --block --port=6379 --dashboard-host=0.0.0.0 --disable-usage-stats --num-gpus=8"
    )
    assert entry(tmp_path, "head", env={"RAY_PORT": "7000"}).startswith("ray start --head --block --port=7000 ")
    assert entry(tmp_path, "worker", "10.0.0.1:6379", "--num-gpus=8") == (
        "ray start --block --address=10.0.0.1:6379 --disable-usage-stats --num-gpus=8"
    )
    assert "usage: worker HEAD_IP:PORT" in entry(tmp_path, "worker")
    assert entry(tmp_path, "--config", "configs/grpo_gpu.yaml", "steps=3") == (
        "roll-train --config configs/grpo_gpu.yaml steps=3"
    )
