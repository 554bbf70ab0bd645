"""workers.backend=auto: local exactly where workers.backend=local is accepted, else ray; each condition flips it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from roll_lite.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]

ASKS_FOR_RAY = [
    ("ray_address=auto",),
    ("workers.actor_dp=2",),
    ("workers.reference_dp=2",),
    ("workers.critic_dp=2",),
    ("workers.gpus_per_rank=1",),
    ("rollout.engine=vllm",),
    ("rollout.fully_async=true", "rollout.schedule=greedy"),
    ("workers.node_labels.actor={gpu: a}",),
]


def resolved(*overrides: str) -> tuple[str, list[str]]:
    notes: list[str] = []
    return load_config(None, list(overrides), notes).workers.backend, notes


def test_default_resolves_to_local(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    backend, notes = resolved()
    assert backend == "local"
    assert notes == [notes[0]] and notes[0].startswith("workers.backend=auto → local")


@pytest.mark.parametrize("overrides", ASKS_FOR_RAY, ids=lambda o: o[0])
def test_each_condition_flips_it_to_ray(monkeypatch, overrides):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    try:
        backend, notes = resolved(*overrides)
    except ConfigError as error:  # a key this box cannot take on its own (e.g. no GPU): not the rule's concern
        pytest.skip(str(error))
    assert backend == "ray"
    assert notes[0].startswith("workers.backend=auto → ray (")
    with pytest.raises(ConfigError, match="workers.backend=ray"):  # local itself still refuses it, clearly
        load_config(None, [*overrides, "workers.backend=local"])


def test_ray_address_in_the_environment(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert resolved() == ("ray", ["workers.backend=auto → ray (RAY_ADDRESS is set)"])


@pytest.mark.parametrize("backend", ["ray", "local"])
def test_explicit_backends_keep_their_meaning(monkeypatch, backend):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert resolved(f"workers.backend={backend}") == (backend, [])


def test_unknown_backend_names_the_key():
    with pytest.raises(ConfigError, match="workers.backend: 'raylet' is not one of auto, ray, local"):
        load_config(None, ["workers.backend=raylet"])


def test_a_default_run_logs_local(tmp_path):
    """roll-train's own line, before anything starts: a default tiny run says it chose local."""
    train = tmp_path / "train.jsonl"
    train.write_text("".join((REPO / "data/reverse_digits/train.jsonl").read_text().splitlines(keepends=True)[:16]))
    tiny = ["model.hidden_size=16", "model.intermediate_size=32", "model.num_hidden_layers=1"]
    tiny += ["model.num_attention_heads=2", "model.num_key_value_heads=1", "sft.steps=0", "eval_every=100"]
    run = subprocess.run(
        [sys.executable, "-m", "roll_lite.cli", *tiny, f"data.train_files={train}", "steps=1"]
        + [f"output_dir={tmp_path}", "save_model=false", "workers.torch_threads=1"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "RAY_ADDRESS": ""},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "workers.backend=auto → local" in run.stdout + run.stderr
