"""Ulysses sequence parallelism from `roll-train` (docs/sequence-parallel.md), each run at S = 2 (workers.actor_dp=2:
D = 1 data-parallel group of 2 ranks) on Ray against the same run at S = 1 with the same D (workers.actor_dp=1,
one rank: workers.backend=local, in this process):
- a tiny PPO run with an SFT warm start, whose actor, critic, reference and teacher split every sequence. Each step's
  losses, grad norms, rewards and KL agree to float32 rounding: the S ranks of a group got the same rows, their
  results were taken once, and the global counts were counted once per token. The KL of step 3 is between the
  actor after one update and the reference, both computed at S = 2;
- with a distillation teacher (distill.signal=top_k_forward_kl), whose pass also splits each sequence at the
  actor's S: its top-k ids and log-probs, gathered per slice;
- its checkpoint of step 2, resumed at S = 2 and at S = 1: step 3 again, as in the uninterrupted runs;
- the DPO pipeline (pairs; its reference worker at the actor's S) and the reward-model pipeline (the score head).
The S = 2 runs start a lean local cluster each (workers/lean_cluster.py), forked from the warm driver with their
workers (tests/warm_workers.py): cheaper than one shared `ray start` head, whose workers Ray starts anew.

The strategy's own exactness at S ∈ {2, 4} is tests/test_exactness_sp.py (float64); this file checks the wiring."""

import json
import logging
import sys
from pathlib import Path

import pytest
import warm_driver

from roll_lite.checkpoint import layout
from roll_lite.cli import main
from roll_lite.model.modeling import build_causal_lm
from roll_lite.model.tokenizer import build_char_tokenizer

REPO = Path(__file__).resolve().parents[1]
MODEL = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_hidden_layers=2",
    "model.num_attention_heads=2",
    "model.num_key_value_heads=1",  # fewer KV heads than S: repeated to S (roll_lite/model/attention.py)
    "workers.torch_threads=1",
    "save_model=false",
]
TINY = [
    *MODEL,
    "reward.functions={token_accuracy: 1.0}",
    "rollout.prompts_per_step=2",
    "rollout.num_samples=4",
    "sft.steps=2",  # the warm start, at the actor's S
    "sft.batch_size=4",
    "steps=3",
    "eval_every=3",
    "checkpoint.every=2",
    "algorithm.kl_coef=0.05",  # a reference worker, whose log-probs enter the loss
    "actor.use_packing=true",  # the actor's micro-batches packed, the critic's padded: both splits
    # a distillation teacher (its workers at the actor's S): its top 3 next tokens, the student's log-probs of them
    "distill.signal=top_k_forward_kl",
    "distill.top_k=3",
    "distill.reward_weight=1.0",
    "distill.coef=0.5",
]
SP = [
    "actor.sequence_parallel=2",
    "critic.sequence_parallel=2",
    "workers.actor_dp=2",  # D·S; reference_dp and critic_dp follow it: in the actor's processes
    "workers.actor_cpus=0.5",
    "workers.rollout_cpus=0.5",
]
COMPARED = ("actor/loss", "actor/pg_loss", "actor/kl", "actor/kl_loss", "actor/grad_norm", "critic/loss")
COMPARED += ("critic/grad_norm", "reward/mean", "eval/reward_mean", "actor/distill_kl", "actor/distill_loss")
PAIRS = [  # the DPO and reward-model pipelines: 2 steps of 4 pairs, held-out metrics at step 0 and 2
    *MODEL,
    "model.pretrained_path=null",
    "preference.steps=2",
    "preference.batch_size=4",
    "preference.eval_every=2",
    "checkpoint.every=0",
]


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def step_metrics(run_dir: Path) -> list[dict]:
    return [record for record in records(run_dir) if "actor/loss" in record]


def assert_same_records(split: list[dict], whole: list[dict], prefixes: tuple[str, ...]) -> None:
    """Every metric under `prefixes` of every record, to float32 rounding."""
    assert [r["step"] for r in split] == [r["step"] for r in whole]
    for a, b in zip(split, whole):
        keys = [key for key in b if key.startswith(prefixes) and "peak_memory" not in key]
        assert keys and set(keys) <= set(a), (b["step"], keys)
        for key in keys:
            assert a[key] == pytest.approx(b[key], rel=2e-5, abs=1e-7), f"step {b['step']}: {key}"


def on_ray(*args: str) -> str:
    """roll-train at S = 2 on a local Ray cluster of its own, forked from the warm driver (its workers too:
    tests/warm_workers.py); its log."""
    command = [sys.executable, "-m", "roll_lite.cli", *args, *SP]
    done = warm_driver.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def in_process(*args: str) -> str:
    """roll-train at S = 1 (one rank, workers.backend=local) in this process; its log."""
    log = Lines()
    logging.getLogger("roll_lite").addHandler(log)
    try:
        assert main([*args, "workers.backend=local"]) == 0
    finally:
        logging.getLogger("roll_lite").removeHandler(log)
    return "\n".join(log.lines)


def teacher(folder: Path) -> Path:
    """A tiny teacher of another seed and depth, with the student's tokenizer."""
    tokenizer = build_char_tokenizer()
    shape = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    lm = build_causal_lm(
        dict(model_type="qwen2", vocab_size=len(tokenizer), num_key_value_heads=1, max_position_embeddings=64, **shape),
        seed=1,
    )
    lm.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sequence_parallel")
    for source, name, rows in (("reverse_digits", "train", 8), ("reverse_digits", "eval", 2)) + tuple(
        ("reverse_digits_pairs", name, rows) for name, rows in (("train", 8), ("eval", 4))
    ):
        lines = (REPO / f"data/{source}/{name}.jsonl").read_text().splitlines(keepends=True)[:rows]
        (folder / f"{source}_{name}.jsonl").write_text("".join(lines))
    rl = ["--config", str(REPO / "configs/ppo.yaml"), *TINY, f"output_dir={folder}"]
    rl += [
        f"data.train_files={folder / 'reverse_digits_train.jsonl'}",
        f"data.eval_files={folder / 'reverse_digits_eval.jsonl'}",
    ]
    rl += [f"sft.train_files={folder / 'reverse_digits_train.jsonl'}", f"distill.teacher={teacher(folder / 'teacher')}"]
    step_2 = layout.step_dir(folder / "s2", 2)  # written at S = 2, resumed at S = 2 and at S = 1
    pairs = {}
    for pipeline in ("dpo", "reward_model"):
        pairs[pipeline] = ["--config", str(REPO / f"configs/{pipeline}.yaml"), *PAIRS, f"output_dir={folder}"]
        pairs[pipeline] += [f"preference.train_files={folder / 'reverse_digits_pairs_train.jsonl'}"]
        pairs[pipeline] += [f"preference.eval_files={folder / 'reverse_digits_pairs_eval.jsonl'}"]
    logs = {}
    logs["s2"] = on_ray(*rl, "run_name=s2")
    logs["s2_resumed"] = on_ray(*rl, "run_name=s2_resumed", f"resume={step_2}")
    for pipeline, args in pairs.items():
        logs[f"{pipeline}_s2"] = on_ray(*args, f"run_name={pipeline}_s2")
    logs["s1"] = in_process(*rl, "run_name=s1")
    logs["s1_resumed"] = in_process(*rl, "run_name=s1_resumed", f"resume={step_2}")
    for pipeline, args in pairs.items():
        logs[f"{pipeline}_s1"] = in_process(*args, f"run_name={pipeline}_s1")
    return folder, logs


def test_the_actor_critic_and_reference_split_each_sequence_over_two_ranks(runs):
    _, logs = runs
    for role, run in (("actor", "s2"), ("critic", "s2"), ("reference", "s2"), ("teacher", "s2"), ("actor", "dpo_s2")):
        line = f"{role}: 2 ranks = 1 data-parallel group(s) × 2 sequence-parallel ranks"
        assert line in logs[run], logs[run][-3000:]
        assert line.split(":")[0] + ": 2 ranks" not in logs[run.replace("s2", "s1")]
    assert "reference: 2 ranks = 1 data-parallel group(s)" in logs["dpo_s2"]  # DPO's reference worker
    assert "actor: 2 ranks = 1 data-parallel group(s)" in logs["reward_model_s2"]


def test_every_step_equals_the_run_at_s1_with_the_same_d(runs):
    folder, logs = runs
    split, whole = step_metrics(folder / "s2"), step_metrics(folder / "s1")
    assert len(split) == len(whole) == 3
    assert whole[-1]["actor/kl"] > 0 and whole[-1]["actor/grad_norm"] > 0  # the reference and the update mattered
    assert whole[-1]["critic/grad_norm"] > 0 and any(r["reward/mean"] > 0 for r in whole)
    assert all(r["actor/distill_kl"] > 0 for r in whole)  # the teacher's scores entered every step
    for step, (a, b) in enumerate(zip(split, whole), start=1):
        for key in COMPARED:
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=2e-5, abs=1e-7), f"step {step}: {key}"
    # the warm start's SFT steps (its log line) and the held-out answers of step 0, after it
    warm = [[line for line in logs[run].splitlines() if "sft step 2/2" in line] for run in ("s2", "s1")]
    assert warm[0] and warm[1] and warm[0][-1].split("|")[1] == warm[1][-1].split("|")[1]  # " loss 4.379 "
    assert_same_records(records(folder / "s2")[:1], records(folder / "s1")[:1], ("eval/",))


def test_a_checkpoint_written_at_s2_resumes_at_s2_and_at_s1(runs):
    folder, logs = runs
    for resumed, uninterrupted in (("s2_resumed", "s2"), ("s1_resumed", "s1")):
        assert f"resumed from {layout.step_dir(folder / 's2', 2)}" in logs[resumed], logs[resumed][-3000:]
        assert [r["step"] for r in step_metrics(folder / resumed)] == [1, 2, 3]  # 1-2 from the checkpoint
        assert_same_records(step_metrics(folder / resumed)[2:], step_metrics(folder / uninterrupted)[2:], COMPARED)


@pytest.mark.parametrize("pipeline, prefix", [("dpo", "dpo/"), ("reward_model", "rm/")])
def test_the_pair_pipelines_equal_their_runs_at_s1(runs, pipeline, prefix):
    folder, _ = runs
    split, whole = records(folder / f"{pipeline}_s2"), records(folder / f"{pipeline}_s1")
    assert whole[-1][f"{prefix}grad_norm"] > 0 and f"eval/{prefix}loss" in whole[-1]
    assert_same_records(split, whole, (prefix, f"eval/{prefix}"))
