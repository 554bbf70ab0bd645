"""The pipeline on real Ray actors: D = 2 actor ranks in one gloo group, a few steps."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import warm_driver

from roll_lite.config import load_config

REPO = Path(__file__).resolve().parents[1]
SMALL = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_hidden_layers=2",
    "model.num_attention_heads=2",
    "model.num_key_value_heads=1",
    "sft.steps=0",
    "workers.torch_threads=1",
    "reward.functions={token_accuracy: 1.0}",  # dense: non-zero advantages even from a random model
]


def small(tmp_path):
    """SMALL + 200 of the demo's training rows and 8 of its eval prompts, as absolute paths (a Ray job
    runs in the job supervisor's directory). All 20,000 rows cost the driver ~3 s of CPU to read and
    tokenize, 200 ~1.2 s; a run of these tests draws far fewer."""
    files = []
    for split, rows in (("train", 200), ("eval", 8)):
        path = tmp_path / f"{split}{rows}.jsonl"
        path.write_text(
            "".join((REPO / f"data/reverse_digits/{split}.jsonl").read_text().splitlines(keepends=True)[:rows])
        )
        files.append(f"data.{split}_files={path}")
    return SMALL + files


@pytest.fixture
def ray_session(tmp_path_factory):
    """start_ray, for a local cluster whose workers fork from a zygote (tests/raylets.py forked_workers), as
    a forked roll-train's do; stopped after the test."""
    from raylets import forked_workers
    from roll_lite.workers.cluster import start_ray, stop_ray

    with forked_workers(tmp_path_factory.mktemp("zygote")):
        yield start_ray
        stop_ray()


def test_two_actor_ranks_train_and_the_rollout_engine_gets_the_new_weights(tmp_path, ray_session):
    from roll_lite.pipelines.ppo import PPOPipeline
    from roll_lite.workers.placement import reservation

    # 2 PPO epochs × 2 mini-batches = 4 optimizer steps; with a 4-step warmup the last one runs at
    # the full learning rate, which is how the test sees that all four happened.
    config = load_config(
        REPO / "configs/grpo.yaml",
        small(tmp_path)
        + [
            "workers.actor_dp=2",
            "workers.actor_cpus=0.5",
            "workers.rollout_cpus=0.5",
            "actor.use_packing=true",
            "actor.grad_accum_steps=2",
            "algorithm.kl_coef=0.05",
            "algorithm.ppo_epochs=2",
            "algorithm.mini_batches=2",
            "actor.warmup_steps=4",
            f"output_dir={tmp_path}",
            "rollout.dtype=bfloat16",  # the engine samples in bf16 (as on a GPU); the actor's weights are cast for it
            "algorithm.rollout_is=token",  # and truncated importance sampling corrects for it
            "workers.offload=true",  # a no-op on CPU; the calls go through the workers' onload / offload wrapper
        ],
    )
    ray_session(None, reservation(config))
    # the lean local cluster (workers/lean_cluster.py): a Ray upgrade that brings back its autoscaler monitor,
    # the dashboard's API server or the dashboard agent fails here; the log monitor (the workers' output in
    # the run's log) stays
    import ray

    processes = ray._private.worker._global_node.all_processes
    assert "monitor" not in processes and "dashboard" not in processes and "log_monitor" in processes
    agents = _children(processes["raylet"][0].process.pid)
    assert not [a for a in agents if "DashboardAgent" in a or "dashboard/agent.py" in a], agents
    assert any("workers/lean_cluster.py" in a for a in agents) and any("RuntimeEnvAgent" in a for a in agents), agents
    pipeline = PPOPipeline(config)
    pipeline.prepare_data()
    pipeline.start_workers()
    pipeline.sync_from_actor(version=0)
    before = pipeline.actor.state_dict()
    version, rollout_before = pipeline.rollout.weights()
    assert {v.dtype for v in rollout_before.values()} == {torch.bfloat16}
    assert version == 0 and all(torch.equal(rollout_before[k], v.to(torch.bfloat16)) for k, v in before.items())

    assert pipeline.sampler.state_dict()["position"] == 0
    metrics = pipeline.step(1)
    assert pipeline.sampler.state_dict()["position"] == config.rollout.prompts_per_step
    after = pipeline.actor.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) == len(before)  # every tensor moved
    version, rollout_after = pipeline.rollout.weights()
    assert version == 1 and all(torch.equal(rollout_after[k], v.to(torch.bfloat16)) for k, v in after.items())
    assert metrics["actor/grad_norm"] > 0 and metrics["actor/num_micro_batches"] == 2
    assert metrics["actor/lr"] == pytest.approx(config.actor.lr)
    assert not pipeline.on_policy  # several optimizer steps per rollout: old log-probs were computed
    for key in ("reward/mean", "actor/kl", "actor/entropy", "actor/pg_loss", "actor/clipfrac", "perf/tokens_per_s"):
        assert key in metrics, key
    # a bf16 engine against a float32 actor: a small, non-zero gap, and weights near 1
    assert 0 < metrics["actor/rollout_logp_gap"] <= metrics["actor/rollout_logp_gap_max"] < 1
    assert metrics["actor/rollout_is_weight"] == pytest.approx(1.0, abs=0.1)
    # the reference kept the initial weights: KL is measured against it
    reference = pipeline.reference.compute_log_probs(
        pipeline.generate(pipeline.eval_data.select([0, 1]), _greedy(config))
    )
    assert torch.isfinite(reference["log_probs"]).all()


def _children(pid: int) -> list[str]:
    """The command lines of the processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] == str(pid):
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:  # gone meanwhile
            pass
    return found


def _greedy(config):
    from roll_lite.rollout import SamplingParams

    return SamplingParams(config.rollout.max_new_tokens, greedy=True)


def test_roll_train_writes_the_run_directory(tmp_path):
    result = warm_driver.run(
        [
            sys.executable,
            "-m",
            "roll_lite.cli",
            "--config",
            str(REPO / "configs/ppo.yaml"),
            *small(tmp_path),
            "steps=2",
            "eval_every=2",
            f"output_dir={tmp_path}",
            "run_name=tiny",
            "wandb_mode=offline",
            "workers.backend=ray",  # on real Ray actors
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = tmp_path / "tiny"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert (
        "eval/reward_mean" in records[0] and "eval/reward_mean" in records[2] and "eval/reward_mean" not in records[1]
    )
    for key in (
        "reward/mean",
        "actor/kl",
        "actor/entropy",
        "actor/pg_loss",
        "actor/grad_norm",
        "actor/clipfrac",
        "perf/tokens_per_s",
        "perf/step_s",
        "critic/vf_loss",
    ):
        assert key in records[1], key
    assert (run_dir / "config.yaml").read_text().startswith("pipeline:")
    curves = (run_dir / "curves.svg").read_text()
    assert all(f">{name}</text>" in curves for name in ("reward/mean", "actor/grad_norm", "perf/step_s"))
    assert list((run_dir / "wandb").glob("offline-run-*")), "wandb offline run missing"
    assert not list(run_dir.glob("*.partial"))
    # The saved policy reloads and reproduces the final greedy held-out reward exactly.
    config = load_config(
        REPO / "configs/ppo.yaml",
        small(tmp_path) + [f"model.pretrained_path={run_dir / 'final'}", f"model.tokenizer_path={run_dir / 'final'}"],
    )
    from roll_lite.pipelines.ppo import PPOPipeline

    from roll_lite.model.modeling import load_causal_lm
    from roll_lite.model.tokenizer import load_tokenizer
    from roll_lite.rewards import get_reward
    from roll_lite.rollout import HFEngine, SamplingParams

    tokenizer = load_tokenizer(config.model.tokenizer_path)
    engine = HFEngine(
        load_causal_lm(config.model, len(tokenizer), seed=123), tokenizer.pad_token_id, tokenizer.eos_token_id
    )
    pipeline = PPOPipeline(config)
    pipeline.prepare_data()
    examples = pipeline.eval_data
    assert len(examples) == 8
    outputs = engine.generate(examples.prompt_ids, SamplingParams(config.rollout.max_new_tokens, greedy=True)).token_ids
    accuracy = get_reward("token_accuracy")
    reward = sum(accuracy(tokenizer.decode(o, skip_special_tokens=True), a) for o, a in zip(outputs, examples.answers))
    assert reward / len(examples) == pytest.approx(records[-1]["eval/reward_mean"], abs=1e-6)
    assert "held-out reward:" in result.stderr


def test_ray_job_submit_to_a_local_head_runs_the_custom_loss_example(tmp_path):
    """The README's cluster recipe, token authentication on: the head, `ray job submit` and the job's
    workers read the token from RAY_AUTH_TOKEN_PATH; a client without it is turned away. The head is
    tests/ray_hosts.py's (`ray start --head`, less what a job does not use), a node of this machine's
    network in a session of its own (tests/raylets.py): stopping it stops this head only, where `ray
    stop` would stop every Ray cluster on the machine (a training run beside the suite too). Its temp
    dir is its own: Ray's job supervisor points the job's driver at the cluster named in <temp
    dir>/ray_current_cluster, which with the default /tmp/ray is the last one `ray start` began here."""
    from ray_hosts import RayCluster
    from raylets import Raylets

    ray, cluster = str(Path(sys.executable).parent / "ray"), None
    try:
        with Raylets(1, "one node, on this machine's network") as hosts:
            cluster = RayCluster(hosts, tmp_path, cpus=2)  # up: its node alive, the dashboard refusing no token
            env, address = cluster.env, cluster.dashboard
            # The example's pipeline class (its loss_func) is imported by the driver and by the workers.
            command = [
                sys.executable,
                "-m",
                "roll_lite.cli",
                "--config",
                str(REPO / "examples/custom_loss/config.yaml"),
                *small(tmp_path),
                "steps=2",
                "eval_every=1",
                f"output_dir={tmp_path}",
                "run_name=job",
                "workers.backend=ray",
            ]
            for _ in range(12):  # a loaded box: the head's job agent can come up seconds after the head starts
                submit = subprocess.run(
                    [
                        ray,
                        "job",
                        "submit",
                        "--address",
                        address,
                        "--runtime-env-json",
                        json.dumps({"env_vars": {"PYTHONPATH": str(REPO)}}),
                        "--",
                        *command,
                    ],
                    capture_output=True,
                    text=True,
                    timeout=600,
                    env=env,
                    cwd=REPO,
                )
                if "No available agent to submit job" not in submit.stderr and "Failed to connect" not in submit.stderr:
                    break
                assert not hosts[0].failed(), (tmp_path / "host1.log").read_text()[-3000:]
                time.sleep(5)
            assert submit.returncode == 0 and "succeeded" in submit.stdout, (
                submit.stdout[-3000:] + submit.stderr[-2000:]
            )
            assert "joined the Ray cluster" in submit.stdout
            for wrong in ({"RAY_AUTH_TOKEN": "not-the-token"}, {"RAY_AUTH_MODE": "disabled"}):
                refused = subprocess.run(
                    [ray, "job", "submit", "--address", address, "--", "echo", "in"],
                    capture_output=True,
                    text=True,
                    timeout=120,
                    env={**env, **wrong},
                )
                assert refused.returncode != 0 and "AuthenticationError" in refused.stderr, (
                    wrong,
                    refused.stderr[-2000:],
                )
    finally:
        if cluster is not None:
            cluster.remove_temp_dirs()
    config_text = (tmp_path / "job" / "config.yaml").read_text()
    assert "pipeline: examples.custom_loss.pipeline:CappedAdvantagePipeline" in config_text
    records = (tmp_path / "job" / "metrics.jsonl").read_text().splitlines()
    assert len(records) == 3
