"""The SFT pipeline's checkpoints, with real roll-train processes and a tiny model: killed with SIGKILL
at a random step and resumed, its metrics equal an uninterrupted run's bit for bit (perf/* timings
aside); a finished run with more sft.steps trains on; an RL run refuses an SFT checkpoint. The reference
runs on Ray, the runs compared with it with workers.backend=local (one process, no Ray, bit for bit the same).

16 training rows, 4 per step: step 4 ends epoch 0, so training runs across an epoch boundary."""

import json
import random
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_resume import LOCAL, assert_rerun_changes_nothing, assert_same_trajectory, metrics, run, run_until

from roll_lite.checkpoint import layout

REPO = Path(__file__).resolve().parents[1]
STEPS = 6
TINY = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_hidden_layers=2",
    "model.num_attention_heads=2",
    "model.num_key_value_heads=1",
    "workers.torch_threads=1",
    "sft.batch_size=4",
    "sft.eval_every=1",
    "checkpoint.every=2",
    "checkpoint.keep_last=null",
    "save_model=true",
]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sft_data")
    for name, rows in (("train", 16), ("eval", 8)):
        lines = (REPO / f"data/reverse_digits/{name}.jsonl").read_text().splitlines(keepends=True)[:rows]
        (folder / f"{name}.jsonl").write_text("".join(lines))
    return [f"sft.train_files={folder / 'train.jsonl'}", f"sft.eval_files={folder / 'eval.jsonl'}"]


def command(data, output: Path, run_name: str, *extra, steps: int = STEPS) -> list[str]:
    return [
        sys.executable,
        "-m",
        "roll_lite.cli",
        "--config",
        str(REPO / "configs/sft.yaml"),
        *TINY,
        *data,
        f"sft.steps={steps}",
        f"output_dir={output}",
        f"run_name={run_name}",
        "workers.backend=ray",  # the reference run on Ray; LOCAL in `extra` overrides it
        *extra,
    ]


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    output = tmp_path_factory.mktemp("sft_reference")
    run(command(data, output, "ref"), fresh=True)
    return output / "ref"


def test_an_sft_run_killed_at_a_random_step_and_resumed_equals_an_uninterrupted_run(data, reference, tmp_path):
    kill_after = random.randint(3, STEPS - 1)
    print(f"SIGKILL after SFT step {kill_after}")
    run_dir = tmp_path / "killed"
    run_until(command(data, tmp_path, "killed", LOCAL), f"sft step {kill_after}/{STEPS} |")
    saved = layout.committed_steps(run_dir)
    assert saved and max(saved) <= kill_after and not (run_dir / "final").exists()
    resumed = run(command(data, tmp_path, "killed", LOCAL))  # resume=auto, the default
    assert f"resumed from {layout.step_dir(run_dir, max(saved))} (step {max(saved)})" in resumed.stderr
    records = metrics(run_dir)
    assert [r["step"] for r in records] == list(range(STEPS + 1))  # step 0: the eval before training
    assert_same_trajectory(records, metrics(reference))
    assert layout.committed_steps(run_dir) == [2, 4, 6]
    traces = pq.read_table(run_dir / "traces").to_pylist()  # each step's sequences (docs/traces.md), once
    assert [(r["step"], r["sample"]) for r in traces] == [(s, i) for s in range(1, STEPS + 1) for i in range(4)]
    assert traces == pq.read_table(reference / "traces").to_pylist()
    assert all(len(r["ids"]) == len(r["loss_mask"]) and 0 < sum(r["loss_mask"]) < len(r["ids"]) for r in traces)
    checkpoint = json.loads((layout.step_dir(run_dir, 6) / layout.MARKER).read_text())
    assert checkpoint["kind"] == "sft" and checkpoint["parts"] == ["actor"]
    assert checkpoint["sampler"] == {**checkpoint["sampler"], "epoch": 1, "position": 8}  # 24 rows drawn of 16
    assert (run_dir / "final" / "config.json").exists()


def test_a_finished_sft_run_run_again_says_so_and_leaves_final_as_it_is(data, reference):
    assert (reference / "final" / "config.json").exists()
    assert_rerun_changes_nothing(
        command(data, reference.parent, "ref"),
        reference,
        f"roll-train: {reference} is finished at step {STEPS} (sft.steps={STEPS}); nothing "
        f"was started or changed. To train it further, raise sft.steps= above {STEPS}",
    )


def test_a_finished_sft_run_given_more_steps_trains_on_from_its_last_checkpoint(data, reference, tmp_path):
    """4 steps, then the same run_name with sft.steps=6: steps 0-4 equal the 6-step run's (a constant
    learning rate: the schedule does not depend on sft.steps), and steps 5-6 are trained."""
    run(command(data, tmp_path, "longer", LOCAL, steps=4))
    assert (tmp_path / "longer" / "final").exists()
    resumed = run(command(data, tmp_path, "longer", LOCAL))
    assert "resumed from" in resumed.stderr and "removed what came after it: final/" in resumed.stderr
    assert_same_trajectory(metrics(tmp_path / "longer"), metrics(reference))


def test_an_rl_run_refuses_an_sft_checkpoint_and_names_final_instead(data, reference, tmp_path):
    checkpoint = layout.step_dir(reference, 2)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "roll_lite.cli",
            "--config",
            str(REPO / "configs/ppo.yaml"),
            *TINY[:5],
            "sft.steps=0",
            f"output_dir={tmp_path}",
            "run_name=rl",
            f"resume={checkpoint}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert (
        f"resume: {checkpoint} is a checkpoint of an SFT run; this run's pipeline "
        "(roll_lite.pipelines.ppo:PPOPipeline) resumes RL checkpoints"
    ) in result.stderr
    assert "model.pretrained_path=" in result.stderr
    assert not (tmp_path / "rl").exists()  # nothing was written
