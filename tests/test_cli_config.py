"""roll-train's config errors: one line naming the key, exit code 2, nothing started or written."""

import subprocess
import sys
from pathlib import Path

import pytest

from roll_lite.cli import main
from roll_lite.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "roll_lite.cli", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


@pytest.mark.parametrize(
    "override, expected",
    [
        ("no_such_key=1", "no_such_key: Key 'no_such_key' not in 'RunConfig'"),
        (
            "rollout.max_new_tokens=many",
            "rollout.max_new_tokens: Value 'many' of type 'str' could not be converted to Integer",
        ),
        (
            "algorithm.loss_agg_mode=mean",
            "algorithm.loss_agg_mode: 'mean' is not one of token-mean, seq-mean-token-sum",
        ),
        ("rollout.temperature=0", "rollout.temperature: must be > 0"),
        ("workers.node_labels.actor.zone=!a", "workers.node_labels.actor.zone: YAML cannot read the value '!a'"),
        (
            "actor.max_tokens_per_micro_batch=64",
            "actor.max_tokens_per_micro_batch: token-budget micro-batches need use_packing",
        ),
        ("reward.functions={bleu: 1.0}", "reward.functions.bleu: 'bleu' is not one of"),
        ("pipeline=nowhere.module:Pipe", "pipeline: cannot import 'nowhere.module:Pipe'"),
        (  # the preflight's (check_run's): it was labelled "pipeline:", and took 3 lines
            "model.model_type=t5|actor.lora.rank=8",
            "config error: model.model_type: transformers builds no causal LM from it: Unrecognized configuration",
        ),
        (
            "algorithm.seq_len_norm=-4",
            "algorithm.seq_len_norm: must be > 0 or null (null: rollout.max_new_tokens), got -4",
        ),
        ("algorithm.seq_len_norm=0", "algorithm.seq_len_norm: must be > 0 or null"),
        ("actor.max_consecutive_skipped_steps=0", "actor.max_consecutive_skipped_steps: must be >= 1 or null"),
        ("algorithm.whiten_advantages=maybe", "algorithm.whiten_advantages: Value 'maybe' is not a valid bool"),
        ("algorithm.kl_clamp=0", "algorithm.kl_clamp: must be > 0 or null (null: the exact KL estimate), got 0.0"),
        ("algorithm.kl_clamp=-10", "algorithm.kl_clamp: must be > 0 or null"),
        ("algorithm.kl_clamp=wide", "algorithm.kl_clamp: Value 'wide' of type 'str' could not be converted to Float"),
        ("data.epochs=0", "data.epochs: must be >= 1 or null (unbounded), got 0"),
        ("data.max_prompt_length=0", "data.max_prompt_length: must be >= 1 or null (no limit), got 0"),
        ("data.eval_num_samples=-1", "data.eval_num_samples: must be >= 0 (0: greedy eval only), got -1"),
        ("data.train_files={a: 1}", "data.train_files: must be a path or a list of paths, got {'a': 1}"),
        ("data.answer_key=prompt", "data.answer_key: must differ from data.prompt_key ('prompt')"),
        ("task.name=reverse_digits", "task: Key 'task' not in 'RunConfig'"),
        ("checkpoint.every=-1", "checkpoint.every: must be >= 0 (0: only at the end), got -1"),
        ("checkpoint.keep_last=0", "checkpoint.keep_last: must be >= 1 or null (keep all), got 0"),
        ("checkpoint.evry=5", "checkpoint.evry: Key 'evry' not in 'CheckpointConfig'"),
        ("resume=", "resume: must be auto, none or the path of a checkpoint folder"),
        ("run_name=a/b", "run_name: must be a folder name (no '/'), got 'a/b'"),
        ("rollout.dtype=fp8", "rollout.dtype: 'fp8' is not one of float32, bfloat16, float64"),
        ("workers.object_store_mb=10", "workers.object_store_mb: must be >= 64, got 10"),
        ("algorithm.rollout_is=batch", "algorithm.rollout_is: 'batch' is not one of token, sequence"),
        ("algorithm.rollout_is_cap=0", "algorithm.rollout_is_cap: must be > 0, got 0.0"),
        ("rollout.async_steps=-1", "rollout.async_steps: must be >= 0 (0: on-policy), got -1"),
        (
            "rollout.fully_async=true|rollout.async_steps=1",
            "rollout.async_steps: rollout.fully_async=true schedules the generations ahead itself",
        ),
        (
            "rollout.fully_async=true|rollout.max_staleness=-1",
            "rollout.max_staleness: must be >= 0 (0: on-policy), got -1",
        ),
        (
            "rollout.fully_async=true|rollout.on_update=wait",
            "rollout.on_update: 'wait' is not one of continue, drop, finish",
        ),
        (
            "rollout.fully_async=true|rollout.segment_tokens=11",
            "rollout.segment_tokens: must be null or in 1..rollout.max_new_tokens (10), got 11",
        ),
        (
            "rollout.fully_async=true|rollout.schedule=fast",
            "rollout.schedule: 'fast' is not one of deterministic, greedy",
        ),
        (
            "rollout.fully_async=true|rollout.schedule=greedy|rollout.on_update=finish",
            "rollout.schedule: greedy advances the later batches while a step trains",
        ),
        (
            "rollout.in_actor=true|rollout.fully_async=true",
            "rollout.fully_async: rollout.in_actor=true needs rollout.fully_async=false",
        ),
        ("reward.on_failure=skip", "reward.on_failure: 'skip' is not one of zero, drop"),
        (
            "reward.judges={/nonexistent/judge: 1.0}",
            "reward.judges./nonexistent/judge: no such folder '/nonexistent/judge'",
        ),
        ("reward.models={/nonexistent/rm: 1.0}", "reward.models./nonexistent/rm: no such folder '/nonexistent/rm'"),
        (
            "rollout.in_actor=true|workers.actor_dp=2",
            "workers.actor_dp: rollout.in_actor=true needs workers.actor_dp=1",
        ),
        (
            "rollout.in_actor=true|rollout.async_steps=1",
            "rollout.async_steps: rollout.in_actor=true needs rollout.async_steps=0",
        ),
        (
            "rollout.in_actor=true|workers.offload=true",
            "workers.offload: rollout.in_actor=true needs workers.offload=false",
        ),
        (
            "rollout.in_actor=true|workers.gpus_per_rank=1|workers.rollout_gpus=1",
            "workers.rollout_gpus: rollout.in_actor=true needs workers.rollout_gpus=0 (the engine generates on the actor's GPU)",
        ),
    ],
)
def test_bad_config_exits_2_with_one_line(tmp_path, capsys, override, expected):  # override: a|b for two
    assert main(["--config", str(REPO / "configs/grpo.yaml"), *override.split("|"), f"output_dir={tmp_path}/out"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_only_the_pipeline_imports_errors_are_labelled_pipeline(tmp_path, capsys, monkeypatch):
    """A check's ValueError that names its own key was printed as `config error: pipeline: <key>: ...`."""
    import roll_lite.cli

    def check_run(config):
        raise ValueError("model.tokenizer_path: no tokenizer in '/nowhere'")

    monkeypatch.setattr(roll_lite.cli, "check_run", check_run)
    assert main(["--config", str(REPO / "configs/grpo.yaml"), f"output_dir={tmp_path}/out"]) == 2
    assert capsys.readouterr().err == "roll-train: config error: model.tokenizer_path: no tokenizer in '/nowhere'\n"


# Each pipeline class with a key that only it (its constructor, or its code before the first step) refuses.
PIPELINES_OWN_ERRORS = {
    "PPOPipeline": (
        "ppo.yaml",
        ["model.max_position_embeddings=16", "rollout.max_new_tokens=8"],  # checked against the data's prompts
        "rollout.max_new_tokens: the longest prompt (9 tokens, data.train_files / data.eval_files) + "
        "rollout.max_new_tokens=8 = 17 exceeds model.max_position_embeddings=16",
    ),
    "PPOPipeline, distill": (
        "distill.yaml",
        ["distill.teacher=/nonexistent/teacher"],  # the teacher's tokenizer, loaded before Ray
        "distill.teacher: no such folder '/nonexistent/teacher'",
    ),
    "MultiTurnPipeline": (
        "multiturn.yaml",
        ["environment.name=null"],  # its constructor
        "environment.name: MultiTurnPipeline needs an environment",
    ),
    "SFTPipeline": ("sft.yaml", ["sft.steps=0"], "sft.steps: the SFT pipeline trains sft.steps steps; set it >= 1"),
    "DPOPipeline": (
        "dpo.yaml",
        ["model.pretrained_path=null", "critic.lora.rank=4"],
        "critic.lora.rank: the DPO pipeline has no critic",
    ),
    "RewardModelPipeline": (
        "reward_model.yaml",
        ["actor.lora.rank=4"],
        "actor.lora.rank: the reward-model pipeline trains the whole model and its score head",
    ),
}


@pytest.mark.parametrize("case", PIPELINES_OWN_ERRORS)
def test_a_pipelines_own_config_error_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, case):
    config_file, overrides, expected = PIPELINES_OWN_ERRORS[case]
    monkeypatch.chdir(REPO)  # the configs' data paths are relative to the repository
    small = ["data.train_files=data/reverse_digits/eval.jsonl", "sft.steps=0"] if case.startswith("PPO") else []
    args = [*small, *overrides, f"output_dir={tmp_path}/out"]
    assert load_config(f"configs/{config_file}", args).pipeline.endswith(case.split(",")[0])  # valid as a config
    code = main(["--config", f"configs/{config_file}", *args])
    err = capsys.readouterr().err
    ours = [line for line in err.splitlines() if line.startswith("roll-train")]  # the others: the log's lines
    assert code == 2 and len(ours) == 1 and ours[0].startswith(f"roll-train: config error: {expected}"), err[-2000:]
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_every_pipeline_class_has_a_case_above():
    import importlib
    import pkgutil

    import roll_lite.pipelines

    bases = {"SupervisedPipeline", "PairPipeline"}  # what the SFT, DPO and reward-model pipelines share

    def module_name(module) -> str:
        return f"roll_lite.pipelines.{module.name}"

    shipped = {
        name
        for module in pkgutil.iter_modules(roll_lite.pipelines.__path__)
        for name, value in vars(importlib.import_module(module_name(module))).items()
        if name.endswith("Pipeline") and isinstance(value, type) and value.__module__ == module_name(module)
    }
    assert shipped - bases == {case.split(",")[0] for case in PIPELINES_OWN_ERRORS}


def test_the_command_itself_exits_2_with_one_line(tmp_path):
    """The process, not main(): a pipeline's constructor refusing a key ends in one line, no traceback."""
    result = run_cli("--config", str(REPO / "configs/multiturn.yaml"), "environment.name=null", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.startswith("roll-train: config error: environment.name: ")
    assert result.stderr.count("\n") == 1 and not result.stdout and not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["configs/ppo.yaml", "steps=5"],
            "'configs/ppo.yaml' is not a key=value override: give a config file with --config, "
            "e.g. roll-train --config configs/ppo.yaml steps=5 output_dir={out}",
        ),
        (
            ["--config", "configs/grpo.yaml", "configs/ppo.yaml"],
            "'configs/ppo.yaml' is not a key=value override, and --config already names 'configs/grpo.yaml': "
            "one config file per run",
        ),
        (["--config", "configs/ppo.yml"], "--config: no such file 'configs/ppo.yml'; did you mean 'configs/ppo.yaml'?"),
        (
            ["--config", "configs/grpo_asyn.yaml"],
            "--config: no such file 'configs/grpo_asyn.yaml'; did you mean 'configs/grpo_async.yaml'?",
        ),
        (["--config", "nope.yaml"], "--config: no such file 'nope.yaml'"),  # nothing close: no guess
    ],
)
def test_a_config_file_misplaced_or_misspelt_is_one_line_saying_what_was_meant(
    tmp_path, capsys, monkeypatch, argv, expected
):
    monkeypatch.chdir(REPO)
    assert main([*argv, f"output_dir={tmp_path / 'out'}"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"roll-train: config error: {expected.format(out=tmp_path / 'out')}"
    ]
    assert not (tmp_path / "out").exists()


def test_yaml_and_overrides_merge_over_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("steps: 7\nalgorithm:\n  advantage: rloo\n")
    config = load_config(path, ["rollout.num_samples=4", "actor.lr=3e-4"])
    assert (config.steps, config.algorithm.advantage, config.rollout.num_samples, config.actor.lr) == (
        7,
        "rloo",
        4,
        3e-4,
    )
    assert config.algorithm.clip_ratio_high is None  # a default: null, the policy loss's own (ppo: 0.2)
    assert (config.algorithm.whiten_advantages, config.algorithm.kl_clamp) == (None, None)  # by estimator; exact KL
    assert config.data.train_files == [] and load_config(path, ["data.train_files=a.jsonl"]).data.train_files == [
        "a.jsonl"
    ]
    with pytest.raises(ConfigError, match="rollout.num_samples: rloo needs >= 2 samples"):
        load_config(path, ["rollout.num_samples=1"])


@pytest.mark.parametrize(
    "overrides, in_actor",
    [
        ([], True),  # one CPU actor rank, on-policy: the actor's process generates
        (["rollout.in_actor=false"], False),
        (["workers.actor_dp=2"], False),
        (["rollout.async_steps=1"], False),
        (["rollout.dtype=bfloat16"], False),
        (["workers.gpus_per_rank=1"], False),  # on a GPU (a copy of the weights in the engine's dtype): asked for
    ],
)
def test_rollout_in_actor_null_is_chosen_exactly_when_it_can_run(overrides, in_actor):
    assert load_config(REPO / "configs/ppo.yaml", overrides).rollout.in_actor is in_actor


@pytest.mark.parametrize("overrides", [["rollout.dtype=bfloat16"], ["workers.gpus_per_rank=1"]])
def test_rollout_in_actor_true_runs_with_a_copy_of_its_own(overrides):
    """A rollout dtype of its own or a GPU: the engine copies the actor's parameters on the device."""
    assert load_config(REPO / "configs/ppo.yaml", ["rollout.in_actor=true", *overrides]).rollout.in_actor is True


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["actor.sequence_parallel=0"], "actor.sequence_parallel: must be >= 1"),
        (["critic.sequence_parallel=3"], "critic.sequence_parallel: 3 does not divide workers.critic_dp: 1 ranks"),
        (["actor.sequence_parallel=8", "workers.actor_dp=8"], "does not divide the model's 4 attention heads"),
        (
            ["actor.sequence_parallel=4", "workers.actor_dp=4", "model.num_attention_heads=12"]
            + ["model.num_key_value_heads=6", "model.hidden_size=96"],
            "actor.sequence_parallel: the model's 6 key / value heads are neither a multiple of 4 nor a divisor",
        ),
        # the reference runs at the actor's degree, on its own ranks
        (
            ["actor.sequence_parallel=2", "workers.actor_dp=2", "workers.reference_dp=1"],
            "workers.reference_dp: 1 ranks",
        ),
        # the forwards that do not split sequences yet (docs/sequence-parallel.md)
        (["actor.sequence_parallel=2", "workers.actor_dp=2", "rollout.exact=true"], r"exact rollout mode .* yet"),
        (
            ["actor.sequence_parallel=2", "workers.actor_dp=2", "workers.backend=local"],
            "actor.sequence_parallel: 2 ranks",
        ),
    ],
)
def test_sequence_parallel_degree_is_checked_before_anything_starts(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_sequence_parallel_runs_on_ray_with_the_reference_at_the_actors_degree():
    """A valid degree (2 KV heads repeated at S = 4): D = 1 group of 4 actor ranks; the reference's and the
    critic's unset ranks are the actor's, in its processes (the reference runs at actor.sequence_parallel, the
    critic at its own S = 1: 4 groups of 1); the warm start (SFT) and the DPO pipeline split sequences too."""
    config = load_config(None, ["actor.sequence_parallel=4", "workers.actor_dp=4"])
    w = config.workers
    assert (w.backend, w.reference_dp, w.critic_dp, w.one_process_per_rank) == ("ray", 4, 4, True)
    warm = load_config(REPO / "configs/ppo.yaml", ["actor.sequence_parallel=2", "workers.actor_dp=2"])
    assert warm.sft.steps > 0 and warm.actor.sequence_parallel == 2
    dpo = load_config(REPO / "configs/dpo.yaml", ["actor.sequence_parallel=2", "workers.actor_dp=2"])
    assert dpo.workers.reference_dp == 2  # its reference worker runs at the actor's degree


def test_a_teacher_whose_heads_do_not_split_over_s_stops_the_run_before_ray(tmp_path):
    """The teachers run at actor.sequence_parallel: their config.json's heads are checked like the actor's."""
    from roll_lite.pipelines.preflight import check_run
    from transformers import AutoConfig

    AutoConfig.for_model("qwen2", num_attention_heads=3, num_key_value_heads=3, hidden_size=24).save_pretrained(
        tmp_path
    )
    overrides = ["actor.sequence_parallel=2", "workers.actor_dp=2", "sft.steps=0", f"distill.teacher={tmp_path}"]
    with pytest.raises(ConfigError, match=r"actor.sequence_parallel: .*3 attention heads.*teacher's config.json"):
        check_run(load_config(None, overrides))
