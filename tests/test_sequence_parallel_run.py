"""Ulysses sequence parallelism from `roll-train` (docs/sequence-parallel.md): a tiny PPO run whose actor, critic and
reference split every sequence over S = 2 ranks (workers.actor_dp=2: D = 1 data-parallel group of 2), on Ray,
against the same run at S = 1 with the same D (workers.actor_dp=1, one rank: workers.backend=local, in this
process). Each step's losses, grad norms, rewards and KL agree to float32 rounding: the S ranks of a group got the
same rows, their results were taken once, and the global counts were counted once per token. The KL of step 3
is between the actor after one update and the reference, both computed at S = 2.

The strategy's own exactness at S ∈ {2, 4} is tests/test_exactness_sp.py (float64); this file checks the wiring."""

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from roll_lite.cli import main

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_hidden_layers=2",
    "model.num_attention_heads=2",
    "model.num_key_value_heads=1",  # fewer KV heads than S: repeated to S (roll_lite/model/attention.py)
    "sft.steps=0",
    "workers.torch_threads=1",
    "reward.functions={token_accuracy: 1.0}",
    "rollout.prompts_per_step=2",
    "rollout.num_samples=4",
    "steps=3",
    "eval_every=3",
    "checkpoint.every=0",
    "save_model=false",
    "algorithm.kl_coef=0.05",  # a reference worker, whose log-probs enter the loss
    "actor.use_packing=true",  # the actor's micro-batches packed, the critic's padded: both splits
]
SP = [
    "actor.sequence_parallel=2",
    "critic.sequence_parallel=2",
    "workers.actor_dp=2",  # D·S; reference_dp and critic_dp follow it: in the actor's processes
    "workers.actor_cpus=0.5",
    "workers.rollout_cpus=0.5",
]
COMPARED = ("actor/loss", "actor/pg_loss", "actor/kl", "actor/kl_loss", "actor/grad_norm", "critic/loss")
COMPARED += ("critic/grad_norm", "reward/mean")


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def step_metrics(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [record for record in records if "actor/loss" in record]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sequence_parallel")
    for name, rows in (("train", 8), ("eval", 2)):
        lines = (REPO / f"data/reverse_digits/{name}.jsonl").read_text().splitlines(keepends=True)[:rows]
        (folder / f"{name}.jsonl").write_text("".join(lines))
    common = [
        "--config",
        str(REPO / "configs/ppo.yaml"),
        *TINY,
        f"data.train_files={folder / 'train.jsonl'}",
        f"data.eval_files={folder / 'eval.jsonl'}",
        f"output_dir={folder}",
    ]
    split = subprocess.run(
        [sys.executable, "-m", "roll_lite.cli", *common, "run_name=s2", *SP],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert split.returncode == 0, split.stderr[-3000:]
    log = Lines()
    logging.getLogger("roll_lite").addHandler(log)
    try:
        assert main([*common, "run_name=s1", "workers.backend=local"]) == 0
    finally:
        logging.getLogger("roll_lite").removeHandler(log)
    return {"s2": folder / "s2", "s1": folder / "s1", "s2_log": split.stderr, "s1_log": "\n".join(log.lines)}


def test_the_actor_critic_and_reference_split_each_sequence_over_two_ranks(runs):
    for role in ("actor", "critic", "reference"):
        line = f"{role}: 2 ranks = 1 data-parallel group(s) × 2 sequence-parallel ranks"
        assert line in runs["s2_log"], runs["s2_log"][-3000:]
        assert line.split(":")[0] + ": 2 ranks" not in runs["s1_log"]


def test_every_step_equals_the_run_at_s1_with_the_same_d(runs):
    split, whole = step_metrics(runs["s2"]), step_metrics(runs["s1"])
    assert len(split) == len(whole) == 3
    assert whole[-1]["actor/kl"] > 0 and whole[-1]["actor/grad_norm"] > 0  # the reference and the update mattered
    assert whole[-1]["critic/grad_norm"] > 0 and any(r["reward/mean"] > 0 for r in whole)
    for step, (a, b) in enumerate(zip(split, whole), start=1):
        for key in COMPARED:
            assert a[key] == pytest.approx(b[key], rel=2e-5, abs=1e-7), f"step {step}: {key}"
