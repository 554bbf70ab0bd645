"""Real roll-train processes, tiny model: killed with SIGKILL and resumed, killed while writing a
checkpoint, run twice, resumed on another D, generating one step ahead (rollout.async_steps=1), fully
async (rollout.fully_async: max_staleness 0 equal to the lockstep run, configs/grpo_async.yaml). The
metrics trajectory of a run is compared, key by key and bit for bit, with an uninterrupted run's
(perf/* timings aside: they are wall-clock times). The lockstep reference runs on Ray and the runs killed and
resumed with workers.backend=local (no Ray, bit for bit the same); the fully async reference runs locally, its
killed run on Ray: so each comparison is also one of Ray and local through a SIGKILL and a resume.

The training file has 8 prompts and a step draws 2: steps 4 and 8 end an epoch, so the checkpoint
of step 4 sits on an epoch boundary (sampler epoch 1, position 0)."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import warm_driver
from mismatch_records import MISMATCH, assert_mismatch_logged

from roll_lite.checkpoint import layout
from roll_lite.runtime.tracking import step_span

REPO = Path(__file__).resolve().parents[1]
STEPS = 6
TINY = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_hidden_layers=2",
    "model.num_attention_heads=2",
    "model.num_key_value_heads=1",
    "sft.steps=0",
    "workers.torch_threads=1",
    "reward.functions={token_accuracy: 1.0}",
    "rollout.prompts_per_step=2",
    "rollout.num_samples=4",
    f"steps={STEPS}",
    "eval_every=2",
    "checkpoint.every=2",
    "checkpoint.keep_last=null",
    "save_model=false",
]
ASYNC = ["rollout.async_steps=1", "algorithm.rollout_is=token"]
# one process, no Ray (workers/local.py), bit for bit the Ray run: for the runs that test the pipeline and its
# checkpoints, not Ray; compared with a Ray reference, each such run is a Ray/local comparison too
LOCAL = "workers.backend=local"
# the fully async mode's own metrics (pipelines/async_schedule.py)
FULLY_ASYNC_ONLY = ("rollout/staleness_token_mean", "rollout/mixed_version_share", "rollout/dropped_tokens")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    for name, rows in (("train", 8), ("eval", 8)):
        lines = (REPO / f"data/reverse_digits/{name}.jsonl").read_text().splitlines(keepends=True)[:rows]
        (folder / f"{name}.jsonl").write_text("".join(lines))
    return [f"data.train_files={folder / 'train.jsonl'}", f"data.eval_files={folder / 'eval.jsonl'}"]


def command(data, output: Path, run_name: str, *extra, config: str = "configs/ppo.yaml") -> list[str]:
    return [
        sys.executable,
        "-m",
        "roll_lite.cli",
        "--config",
        str(REPO / config),
        *TINY,
        *data,
        f"output_dir={output}",
        f"run_name={run_name}",
        "workers.backend=ray",  # the reference runs on Ray; LOCAL in `extra` overrides it
        *extra,
    ]


def run(args, env=None, fresh: bool = False) -> subprocess.CompletedProcess:
    """roll-train `args` to its end; forked from the warm driver (tests/warm_driver.py), or with `fresh` a
    process started anew: the reference runs, so that each comparison spans two processes started apart."""
    result = warm_driver.run(args, fresh=fresh, capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def run_until(args, line_part: str, env=None) -> str:
    """Start roll-train in a process group of its own, SIGKILL the group (the driver and the Ray head
    it started) as soon as a log line contains `line_part`; returns the log up to there."""
    process = warm_driver.WarmPopen(
        args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=REPO, env=env, start_new_session=True
    )
    log = []
    try:
        for line in process.stderr:
            log.append(line)
            if line_part in line:
                os.killpg(process.pid, signal.SIGKILL)
                break
        else:
            pytest.fail(f"roll-train ended before '{line_part}':\n" + "".join(log[-30:]))
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL
    return "".join(log)


def lines_of(metrics_file: Path) -> list[str]:
    """The complete records (the kill may have cut the last one short)."""
    return [line for line in metrics_file.read_text().splitlines() if line.endswith("}")]


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def without_timings(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in records]


def assert_same_trajectory(records, reference):
    assert [r["step"] for r in records] == [r["step"] for r in reference]
    for got, expected in zip(without_timings(records), without_timings(reference)):
        differing = {
            k: (got.get(k), expected.get(k)) for k in set(got) | set(expected) if got.get(k) != expected.get(k)
        }
        assert not differing, f"step {got['step']}: {differing}"


def traces(run_dir: Path) -> list[dict]:
    """The run's per-sample traces (docs/traces.md), step by step: each step once, its samples in order."""
    rows = pq.read_table(run_dir / "traces").to_pylist()
    assert [(r["step"], r["sample"]) for r in rows] == [(s, i) for s in range(1, STEPS + 1) for i in range(8)]
    return rows


def assert_same_traces(run_dir: Path, reference: Path) -> None:
    for got, expected in zip(traces(run_dir), traces(reference), strict=True):
        assert got == expected, f"step {got['step']} sample {got['sample']}"


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    """An uninterrupted run: its run directory."""
    output = tmp_path_factory.mktemp("reference")
    (output / "driver.log").write_text(run(command(data, output, "ref"), fresh=True).stderr)
    return output / "ref"


def test_the_engine_trainer_mismatch_is_logged_every_step_and_drawn(reference):
    records = metrics(reference)[1:]
    assert_mismatch_logged(records, [set()] * STEPS)  # on-policy, lockstep: no version split
    # float32 engine and actor, the same weights: float32 noise
    assert all(r[f"{MISMATCH}/logp_gap_max"] < 1e-4 and r[f"{MISMATCH}/ratio_out_of_band"] == 0 for r in records)
    curves = (reference / "curves.svg").read_text()
    assert f"{MISMATCH}/logp_gap_p99" in curves and f"{MISMATCH}/ratio_out_of_band" in curves


def test_killed_at_a_random_step_and_resumed_the_metrics_equal_an_uninterrupted_run(data, reference, tmp_path):
    kill_after = random.randint(3, STEPS - 1)
    print(f"SIGKILL after step {kill_after}")
    run_dir = tmp_path / "killed"
    run_until(command(data, tmp_path, "killed", LOCAL), f"step {kill_after}/{STEPS} |")
    # Determinism: a second run of the same config, in a process of its own, gives the same metrics
    # bit for bit, evals included: steps 0 .. kill_after - 1, all written before step kill_after ended.
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()[:kill_after]
    before_the_kill = [json.loads(line) for line in lines]
    assert [r["step"] for r in before_the_kill] == list(range(kill_after))
    assert before_the_kill[2]["eval/reward_mean"] is not None
    assert_same_trajectory(before_the_kill, metrics(reference)[:kill_after])
    saved = layout.committed_steps(run_dir)
    assert saved and max(saved) <= kill_after
    logged_after = [json.loads(line)["step"] for line in lines_of(run_dir / "metrics.jsonl")]
    logged_after = [step for step in logged_after if step > max(saved)]
    # resume=auto, the default; with a key a resume may change (the driver's stall warnings: not the trajectory)
    resumed = run(command(data, tmp_path, "killed", LOCAL, "workers.stall_warning_s=299"))
    assert f"resumed from {run_dir / 'checkpoints' / f'step_{max(saved)}'}" in resumed.stderr
    change = "workers.stall_warning_s: 300.0 -> 299.0"
    assert (
        f"resume: changed since step_{max(saved)}, applied from step {max(saved) + 1} on and recorded in "
        f"config.yaml: {change}"
    ) in resumed.stderr
    recorded = (run_dir / "config.yaml").read_text()
    assert recorded.splitlines()[1] == f"# Steps after {max(saved)}: {change}" and "stall_warning_s: 299.0" in recorded
    assert (layout.step_dir(run_dir, STEPS) / "config.yaml").read_text() == recorded
    assert not (layout.step_dir(run_dir, max(saved)) / "config.yaml").read_text().startswith("#")  # the first segment's
    assert json.loads((layout.step_dir(run_dir, STEPS) / layout.MARKER).read_text())["config_changes"] == [
        {"step": max(saved), "changed": {"workers.stall_warning_s": [300.0, 299.0]}}
    ]
    dropped = [
        line.split(" ", 1)[1] for line in resumed.stderr.splitlines() if "resume: dropped the records of" in line
    ]
    assert dropped == (
        [
            f"resume: dropped the records of {step_span(logged_after)} that the previous run logged after "
            f"checkpoint step_{max(saved)}"
        ]
        if logged_after
        else []
    ), (logged_after, dropped)
    assert_same_trajectory(metrics(run_dir), metrics(reference))  # continued: no record lost or repeated
    assert layout.committed_steps(run_dir) == [2, 4, 6]
    assert_same_traces(run_dir, reference)  # every step traced once, as the uninterrupted run's


# roll-train's main, exiting 99 the moment it would start Ray (or join a cluster)
NO_RAY = "import sys, ray; ray.init = lambda *a, **k: sys.exit(99); from roll_lite.cli import main; sys.exit(main(sys.argv[1:]))"


def assert_rerun_changes_nothing(args: list[str], run_dir: Path, expected_line: str) -> None:
    """roll-train `args` (a finished run's command) again: one line, exit 0 within seconds, Ray not
    started, every file of the run directory as it was (bytes and mtimes), none added."""

    def files():
        return {
            str(p.relative_to(run_dir)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name != ".lock"
        }

    before = files()
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", NO_RAY, *args[3:]], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    seconds = time.monotonic() - start
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.splitlines() == [expected_line] and result.stdout == ""
    assert seconds < 30, seconds  # imports only (~7 s on 2 cores); a Ray start and the workers alone are more
    assert files() == before


def test_a_finished_run_run_again_says_so_and_starts_nothing(data, reference):
    assert_rerun_changes_nothing(
        command(data, reference.parent, "ref"),
        reference,
        f"roll-train: {reference} is finished at step {STEPS} (steps={STEPS}); nothing was "
        f"started or changed. To train it further, raise steps= above {STEPS}",
    )


def test_rollout_and_reward_workers_of_their_own_give_the_same_run_as_the_actor_and_the_driver(
    data, reference, tmp_path
):
    """The reference, on one CPU actor rank, generates in the actor's process with the actor's own
    parameters (rollout.in_actor=null chose it: no weight copies, no rollout process), computes the
    reference's log-probs and the critic's values in that process too (workers.one_process_per_rank=null
    chose it) and scores its token_accuracy reward in the driver (reward.in_driver=null chose it: no reward
    process). With a rollout worker, a reference, a critic and a reward worker in processes of their own and
    the same seeds, the trajectory is the same bit for bit, through a SIGKILL and a resume (the engine's
    sampling position is in the checkpoint). The rollout worker runs the fully async mode with
    rollout.max_staleness=0, which is the lockstep run bit for bit (pipelines/async_schedule.py): each
    batch is admitted and generated whole, in one call, at the start of its step."""
    reference_log = (reference.parent / "driver.log").read_text()
    assert "rollout engine: hf (rollout.in_actor: in the actor's process" in reference_log
    assert "rewards: scored in the driver (reward.in_driver" in reference_log
    for role in ("reference", "critic"):
        assert f"{role}: in the actor's processes, a model of its own (workers.one_process_per_rank" in reference_log
    args = command(
        data,
        tmp_path,
        "worker",
        "rollout.in_actor=false",
        "reward.in_driver=false",
        "workers.one_process_per_rank=false",
        "rollout.fully_async=true",
        "rollout.max_staleness=0",
    )
    # killed as soon as step 2's checkpoint is committed: the resume starts from it, nothing is trained twice
    log = run_until(args, f"checkpoint {layout.step_dir(tmp_path / 'worker', 2)} written in")
    assert "rollout engine: hf (rollout.engine=hf)" in log and "rewards: scored by a reward worker of its own" in log
    for role in ("reference", "critic"):
        assert f"{role}: 1 process of its own (workers.one_process_per_rank=false)" in log
    assert "rollout.fully_async: batches up to 0 step(s) ahead" in log
    run(args)
    records = metrics(tmp_path / "worker")
    assert all(r["rollout/staleness_token_mean"] == r["rollout/mixed_version_share"] == 0 for r in records[1:])
    without = [{k: v for k, v in r.items() if k not in FULLY_ASYNC_ONLY} for r in records]
    assert_same_trajectory(without, metrics(reference))


@pytest.fixture(scope="module")
def async_reference(data, tmp_path_factory):
    """An uninterrupted run that generates one step ahead: its run directory (local: tests/test_local_backend.py
    runs this config on Ray and locally and compares the two)."""
    output = tmp_path_factory.mktemp("async")
    run(command(data, output, "ref", *ASYNC, LOCAL), fresh=True)
    return output / "ref"


def test_one_step_ahead_samples_with_the_previous_weights_and_logs_its_staleness(async_reference):
    records = metrics(async_reference)[1:]
    assert [r["rollout/staleness"] for r in records] == [0] + [1] * (STEPS - 1)
    # Step 1 samples with the actor's own weights (|Δ log p| is float32 noise); from step 3 on the weights
    # that sampled are one update behind (step 1 updates nothing: zero advantages), and the loss is
    # weighted by the importance ratio to them.
    assert records[0]["actor/rollout_logp_gap"] < 1e-5
    assert all(r["actor/rollout_logp_gap"] > 1e-4 for r in records[2:])
    assert all(r["actor/rollout_is_weight"] != 1.0 for r in records[2:])
    # step 1's batch is the actor's own weights' (current), every later one a version behind (older)
    assert_mismatch_logged(records, [{"current_weights"}] + [{"older_weights"}] * (STEPS - 1))
    ahead = json.loads((layout.step_dir(async_reference, 2) / "rollouts_ahead.json").read_text())
    assert [(item["step"], item["weight_version"]) for item in ahead] == [(3, 1)]


def test_killed_while_writing_a_checkpoint_the_previous_one_loads(data, async_reference, tmp_path):
    """An async run (rollout.async_steps=1): the checkpoint of step 2 it resumes from also holds the
    batch generated ahead for step 3, with weights that are gone; the trajectory still continues the
    uninterrupted async run bit for bit."""
    run_dir = tmp_path / "torn"
    env = {**os.environ, "ROLL_LITE_TEST_PAUSE_BEFORE_COMMIT_AT_STEP": "4"}
    run_until(command(data, tmp_path, "torn", *ASYNC, LOCAL), "checkpoint step_4: parts written, pausing", env=env)
    assert layout.partial_dir(run_dir, 4).is_dir() and (layout.partial_dir(run_dir, 4) / "actor" / ".metadata").exists()
    assert layout.latest(run_dir) == layout.step_dir(run_dir, 2) and layout.committed_steps(run_dir) == [2]
    resumed = run(command(data, tmp_path, "torn", *ASYNC, LOCAL))
    assert "resumed from" in resumed.stderr and "step_2 (step 2)" in resumed.stderr
    assert_same_trajectory(metrics(run_dir), metrics(async_reference))
    assert not list(layout.checkpoints_dir(run_dir).glob(".*.partial"))


def test_resume_from_an_epoch_boundary_on_another_actor_and_critic_d(data, reference, tmp_path):
    """resume=PATH of the reference's step 4 (the end of epoch 0) into a new run with 2 actor and critic
    ranks instead of 1: DCP reshards both, training goes on into epoch 1. With 2 reference ranks too, rank i
    of each role lives in actor rank i's process, as in the reference: 3 worker processes, not 5."""
    checkpoint = layout.step_dir(reference, 4)
    assert json.loads((checkpoint / layout.MARKER).read_text())["sampler"]["epoch"] == 1
    wider = run(
        command(
            data,
            tmp_path,
            "wider",
            f"resume={checkpoint}",
            "workers.actor_dp=2",
            "workers.reference_dp=2",
            "workers.critic_dp=2",
            "workers.actor_cpus=0.5",
            "workers.rollout_cpus=0.5",
        )
    )
    for role in ("reference", "critic"):
        assert f"{role}: in the actor's processes, a model of its own (workers.one_process_per_rank" in wider.stderr
    records, expected = metrics(tmp_path / "wider"), metrics(reference)
    assert_same_trajectory(records[:5], expected[:5])  # steps 0-4 come from the checkpoint
    assert [r["step"] for r in records] == list(range(STEPS + 1))
    final = json.loads((layout.step_dir(tmp_path / "wider", 6) / layout.MARKER).read_text())
    assert final["sampler"]["epoch"] == 1 and final["sampler"]["position"] == 4
    # Two ranks sum the gradient in another order: the next steps agree to float32 rounding, not bit for bit.
    for got, want in zip(records[5:], expected[5:]):
        for key in ("reward/mean", "actor/pg_loss", "critic/vf_loss", "actor/grad_norm"):
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), (got["step"], key)


# configs/grpo_async.yaml, rollout.fully_async (pipelines/async_schedule.py): the next batch advances 5 tokens
# per step while a step trains and goes on under the new weights at each update
FULLY_ASYNC = "configs/grpo_async.yaml"


@pytest.fixture(scope="module")
def fully_async_reference(data, tmp_path_factory):
    output = tmp_path_factory.mktemp("fully_async")  # local: its killed run is on Ray
    (output / "driver.log").write_text(run(command(data, output, "ref", LOCAL, config=FULLY_ASYNC), fresh=True).stderr)
    return output / "ref"


def test_fully_async_tokens_span_weight_versions_within_the_bound(fully_async_reference):
    log = (fully_async_reference.parent / "driver.log").read_text()
    assert "rollout.fully_async: batches up to 1 step(s) ahead" in log and "generate 5 tokens per step" in log
    records = metrics(fully_async_reference)[1:]
    assert [r["rollout/staleness"] for r in records] == [0] + [1] * (STEPS - 1)
    # from step 2 on, every sample's first tokens come from the weights before the previous step
    assert all(0 < r["rollout/staleness_token_mean"] < 1 and r["rollout/mixed_version_share"] > 0 for r in records[1:])
    assert_mismatch_logged(records, [{"current_weights"}] + [{"current_weights", "older_weights"}] * (STEPS - 1))
    assert all(r["actor/rollout_is_weight"] != 1.0 for r in records[2:])
    # the traces' tokens: a sample of step 3 was sampled by two weight versions, every one by 1 or 2
    steps = [[set(r["weight_versions"]) for r in traces(fully_async_reference) if r["step"] == s] for s in (1, 3)]
    assert steps[0] == [{0}] * 8 and {1, 2} in steps[1] and all(v <= {1, 2} for v in steps[1])
    in_flight = json.loads((layout.step_dir(fully_async_reference, 2) / "rollouts_in_flight.json").read_text())
    assert in_flight["admitted_up_to"] == 3 and list(in_flight["rows"]) == ["3"]
    rows = in_flight["partial"]["3"]["rows"]
    assert len(rows) == 8 and all(set(row["versions"]) == {1} and 1 <= len(row["tokens"]) <= 5 for row in rows)


def test_fully_async_killed_at_a_random_step_and_resumed_repeats_the_uninterrupted_run(
    data, fully_async_reference, tmp_path
):
    """Two runs of one seed, on Ray and locally, are equal bit for bit up to the kill; the local resume from the Ray
    run's checkpoint (the next batch half generated with weights that are gone) continues the uninterrupted run."""
    kill_after = random.randint(3, STEPS - 1)
    print(f"SIGKILL after step {kill_after}")
    run_until(command(data, tmp_path, "killed", config=FULLY_ASYNC), f"step {kill_after}/{STEPS} |")
    lines = (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()[:kill_after]
    assert_same_trajectory([json.loads(line) for line in lines], metrics(fully_async_reference)[:kill_after])
    resumed = run(command(data, tmp_path, "killed", LOCAL, config=FULLY_ASYNC))
    assert "resumed from" in resumed.stderr
    assert_same_trajectory(metrics(tmp_path / "killed"), metrics(fully_async_reference))
    assert_same_traces(tmp_path / "killed", fully_async_reference)
