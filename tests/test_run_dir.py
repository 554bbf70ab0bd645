"""Run directories: one run at a time (a lock), an existing run is resumed or refused, never
clobbered; bad `resume` values and checkpoints trained with values of keys a resume cannot change
stop roll-train with one line and exit code 2 before Ray starts, leaving nothing behind; the changes
a resume may make, and their record; a finished run names the keys it did not apply. Checkpoint
layout: commit, latest, keep_last."""

import fnmatch
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from roll_lite.checkpoint import CheckpointError, claim_run_dir, layout
from roll_lite.cli import main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def args(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text("".join((REPO / "data/reverse_digits/train.jsonl").read_text().splitlines(keepends=True)[:16]))
    return [
        "--config",
        str(REPO / "configs/ppo.yaml"),
        f"data.train_files={train}",
        "data.eval_files=[]",
        f"output_dir={tmp_path / 'out'}",
        "run_name=demo",
        "sft.steps=0",
    ]


def snapshot(folder: Path) -> dict:
    """Every file but the lock file (left in place: removing a lock file races with its next user)."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def earlier_run(run_dir: Path, with_checkpoint_of: str | None = None) -> None:
    """What an earlier run leaves: config, metrics, a final policy (and optionally a checkpoint)."""
    (run_dir / "final").mkdir(parents=True)
    (run_dir / "final" / "config.json").write_text("{}")
    (run_dir / "config.yaml").write_text("run_name: demo\n")
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n')
    if with_checkpoint_of is not None:
        fake_checkpoint(layout.step_dir(run_dir, 2), with_checkpoint_of)
        (layout.checkpoints_dir(run_dir) / "latest").write_text("step_2\n")


def fake_checkpoint(folder: Path, config_yaml: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(config_yaml)
    (folder / layout.MARKER).write_text(json.dumps({"step": 2}))
    return folder


def run_config_yaml(args, *overrides) -> str:
    from roll_lite.config import load_config, to_yaml

    return to_yaml(load_config(args[1], [a for a in args[2:]] + list(overrides)))


def test_a_second_run_with_the_same_name_is_refused_and_nothing_changes(args, tmp_path, capsys):
    run_dir = tmp_path / "out" / "demo"
    earlier_run(run_dir)
    before = snapshot(run_dir)
    assert main(args + ["resume=none"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "resume=none" in error and "resume=auto" in error and "run_name=" in error
    assert "final, metrics.jsonl" in error  # says what is there
    assert main(args) == 2  # resume=auto (the default): a run without a checkpoint cannot be continued
    error = capsys.readouterr().err.strip()
    assert "resume=auto" in error and "no checkpoint to resume from" in error and "run_name=" in error
    assert snapshot(run_dir) == before  # config, metrics, final/ untouched (the lock file aside)


def test_a_run_dir_in_use_by_a_live_process_is_refused_until_that_process_dies(args, tmp_path, capsys):
    run_dir = tmp_path / "out" / "demo"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from roll_lite.checkpoint import claim_run_dir; "
            f"claim = claim_run_dir({str(run_dir)!r}, 'auto'); print('held', flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(args) == 2
        error = capsys.readouterr().err.strip()
        assert f"is in use by another run (pid {holder.pid})" in error and "run_name=" in error
        with pytest.raises(CheckpointError, match="in use"):
            claim_run_dir(run_dir, "auto")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    claim = claim_run_dir(run_dir, "auto")  # the kernel dropped the killed holder's lock
    assert claim.resume_from is None  # a folder holding only the lock file is an unused one
    claim.release()


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing", "resume: no such checkpoint folder"),
        ("not_a_checkpoint", "is not a checkpoint (no checkpoint.json)"),
        ("other_model", "model.hidden_size: 64 -> 128 (the model its weights belong to)"),
        ("other_data_seed", "data.seed: 7 -> null (its random generators and its prompt order were seeded"),
        (
            "history",
            "sft.steps: 200 -> 0, sft.lr: 0.01 -> 0.002 (the warm start ran, or not, before step 1; a resume "
            "does not run it again); actor.lr: 0.001 -> 0.0002 (a resume restores them with the optimizer's state)",
        ),
    ],
)
def test_bad_resume_paths_exit_2_with_one_line_and_leave_nothing(args, tmp_path, capsys, case, expected):
    target = tmp_path / "elsewhere" / "step_2"
    if case == "not_a_checkpoint":
        target.mkdir(parents=True)
        (target / "notes.txt").write_text("hello")
    elif case == "other_model":
        fake_checkpoint(target, run_config_yaml(args, "model.hidden_size=64"))
    elif case == "other_data_seed":
        fake_checkpoint(target, run_config_yaml(args, "data.seed=7"))
    elif case == "history":  # an RL run after a warm start, with another actor.lr; steps and eval_every may change
        changed = ("sft.steps=200", "sft.lr=0.01", "actor.lr=0.001", "steps=9", "eval_every=3")
        fake_checkpoint(target, run_config_yaml(args, *changed))
    assert main(args + [f"resume={target}"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and expected in error, error
    assert error.startswith("roll-train: config error: resume")
    assert "steps: 9" not in error and "eval_every" not in error
    assert not (tmp_path / "out").exists()  # neither the run directory nor output_dir, which the claim made


def test_an_unreadable_checkpoint_that_resume_would_continue_is_one_line_and_changes_nothing(args, tmp_path, capsys):
    run_dir = tmp_path / "out" / "demo"
    earlier_run(run_dir, with_checkpoint_of="run_name: demo\n")
    (layout.step_dir(run_dir, 2) / layout.MARKER).write_text("{not json")
    before = snapshot(run_dir)
    assert main(args) == 2  # resume=auto: read before the pipeline's data or Ray (is that run finished?)
    error = capsys.readouterr().err
    assert error.splitlines() == [
        f"roll-train: config error: resume: {layout.step_dir(run_dir, 2) / layout.MARKER} cannot be read (JSONDecodeError)"
    ]
    assert snapshot(run_dir) == before


def test_resume_of_another_runs_checkpoint_into_an_existing_run_is_refused(args, tmp_path, capsys):
    run_dir = tmp_path / "out" / "demo"
    earlier_run(run_dir)
    other = fake_checkpoint(tmp_path / "other" / "checkpoints" / "step_2", run_config_yaml(args))
    before = snapshot(run_dir)
    assert main(args + [f"resume={other}"]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert snapshot(run_dir) == before


def test_resume_auto_picks_latest_and_a_run_dir_is_accepted_as_a_resume_path(tmp_path):
    run_dir = tmp_path / "run"
    earlier_run(run_dir, with_checkpoint_of="x: 1\n")
    claim = claim_run_dir(run_dir, "auto")
    assert claim.resume_from == layout.step_dir(run_dir, 2)
    claim.release()
    claim = claim_run_dir(tmp_path / "new", str(run_dir))  # a run directory: its latest checkpoint
    assert claim.resume_from == layout.step_dir(run_dir, 2)
    claim.release()


def test_commit_moves_latest_only_to_complete_checkpoints_and_keeps_the_last_k(tmp_path):
    run_dir = tmp_path / "run"
    for step in (1, 2, 3):
        partial = layout.partial_dir(run_dir, step)
        fake_checkpoint(partial, "")
        layout.commit(partial, layout.step_dir(run_dir, step))
        assert layout.latest(run_dir) == layout.step_dir(run_dir, step)
    fake_checkpoint(layout.partial_dir(run_dir, 4), "")  # a write killed before its commit
    assert layout.latest(run_dir) == layout.step_dir(run_dir, 3) and layout.committed_steps(run_dir) == [1, 2, 3]
    assert layout.prune(run_dir, keep_last=2) == [1]
    assert layout.committed_steps(run_dir) == [2, 3]
    layout.remove_partials(run_dir)
    assert sorted(p.name for p in layout.checkpoints_dir(run_dir).iterdir()) == ["latest", "step_2", "step_3"]
    assert layout.prune(run_dir, keep_last=None) == []


def test_a_resume_applies_and_records_changes_to_the_other_keys(args, tmp_path):
    """What a resume may change it returns (the session logs it); config.yaml heads the config with
    what each resume changed, and still loads as the latest segment's config."""
    from omegaconf import OmegaConf
    from roll_lite.pipelines.ppo import PPOPipeline

    from roll_lite.checkpoint.compat import check_compatible
    from roll_lite.checkpoint.config_changes import config_yaml, history_entry
    from roll_lite.config import load_config, to_yaml

    checkpoint = fake_checkpoint(tmp_path / "step_2", run_config_yaml(args, "steps=4", "data.seed=0"))
    changed = ["rollout.temperature=0.5", "reward.functions={token_accuracy: 1.0}", "workers.stall_warning_s=9"]
    config = load_config(args[1], args[2:] + changed)
    changes = check_compatible(checkpoint, config, "rl", PPOPipeline.checkpoint_compat_keys)
    # data.seed null (seed 0) is the checkpoint's data.seed=0: the same prompt order, no change
    assert [str(change) for change in changes] == [
        "steps: 4 -> 200",
        "rollout.temperature: 1.0 -> 0.5",
        "reward.functions: {exact_answer: 1.0} -> {token_accuracy: 1.0}",
        "workers.stall_warning_s: 300.0 -> 9.0",
    ]
    history = [history_entry(2, changes[:1]), history_entry(5, changes[1:])]
    text = config_yaml(config, history)
    assert text.splitlines()[:3] == [
        "# Resumed with changed keys; the values below are those of the latest segment.",
        "# Steps after 2: steps: 4 -> 200",
        "# Steps after 5: rollout.temperature: 1.0 -> 0.5; reward.functions: {exact_answer: 1.0} -> "
        "{token_accuracy: 1.0}; workers.stall_warning_s: 300.0 -> 9.0",
    ]
    assert OmegaConf.create(text) == OmegaConf.create(to_yaml(config))
    assert config_yaml(config, []) == to_yaml(config)


def test_which_keys_a_resume_may_change_depends_on_the_pipeline():
    from roll_lite.pipelines.dpo import DPOPipeline
    from roll_lite.pipelines.ppo import PPOPipeline
    from roll_lite.pipelines.sft import SFTPipeline

    from roll_lite.checkpoint.compat import RESUME_FIXED, why_fixed
    from roll_lite.checkpoint.config_changes import config_keys

    keys = config_keys()
    for rule in RESUME_FIXED:  # no pattern names a key that does not exist
        assert all(any(fnmatch.fnmatchcase(key, p) for key in keys) for p in rule.keys), rule
    rl, sft, dpo = (
        PPOPipeline.checkpoint_compat_keys,
        SFTPipeline.checkpoint_compat_keys,
        DPOPipeline.checkpoint_compat_keys,
    )
    assert why_fixed("sft.steps", "rl", rl) and why_fixed("sft.train_files", "rl", rl)  # the warm start is history
    assert why_fixed("sft.steps", "sft", sft) is None and why_fixed("sft.train_files", "sft", sft)
    assert why_fixed("sft.lr", "sft", sft) and why_fixed("sft.lr", "dpo", dpo) is None
    assert why_fixed("preference.lr", "dpo", dpo) and why_fixed("preference.reference", "dpo", dpo)
    assert why_fixed("actor.lr", "dpo", dpo) and why_fixed("critic.adam_beta2", "rl", rl)
    for free in ("steps", "actor.warmup_steps", "rollout.temperature", "algorithm.kl_coef", "workers.actor_dp"):
        assert why_fixed(free, "rl", rl) is None, free


def test_a_finished_run_names_the_keys_that_differ_from_its_config_and_were_not_applied(args, tmp_path, capsys):
    run_dir = tmp_path / "out" / "demo"
    earlier_run(run_dir, with_checkpoint_of=run_config_yaml(args, "steps=2"))
    before = snapshot(run_dir)
    finished = f"roll-train: {run_dir} is finished at step 2 (steps=2); nothing was started or changed"
    assert main(args + ["steps=2"]) == 0
    assert capsys.readouterr().err.strip() == f"{finished}. To train it further, raise steps= above 2"
    assert main(args + ["steps=2", "rollout.temperature=0.5", "seed=3"]) == 0
    assert capsys.readouterr().err.strip() == (
        f"{finished}; these keys differ from the run's config.yaml and were not applied: seed: 0 -> 3, "
        "rollout.temperature: 1.0 -> 0.5. To train it further, raise steps= above 2"
    )
    assert snapshot(run_dir) == before
