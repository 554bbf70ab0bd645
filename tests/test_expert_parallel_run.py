"""Expert parallelism from `roll-train` (docs/moe.md): GRPO on a tiny Qwen3-MoE whose actor splits its 4 experts
over EP = 2 ranks (workers.actor_dp=2, on Ray), with the load-balancing and z-losses, a reference (KL) and a
checkpoint at the end, against the same run on one rank at EP = 1 (workers.backend=local). Each step's losses,
grad norms, KL and rewards agree to float32 rounding: the actor's ranks dispatched their tokens to their experts'
owners and the reference, at EP = 1, held every expert.

The strategy's own exactness at EP ∈ {2, 4} is tests/test_exactness_ep.py (float64); this file checks the wiring."""

import pytest
from test_resume import data as data  # noqa: F401 (a fixture)
from test_resume import metrics, run
from tiny_moe import TINY_MOE, roll_train

from roll_lite.config import load_config

MOE = [
    *TINY_MOE,
    "sft.steps=0",
    "workers.torch_threads=1",
    "reward.functions={token_accuracy: 1.0}",
    "rollout.prompts_per_step=2",
    "rollout.num_samples=4",
    "algorithm.kl_coef=0.05",  # a reference worker, at EP = 1, whose log-probs enter the loss
    "actor.use_packing=true",
    "actor.moe_aux_loss_coef=0.01",
    "actor.moe_z_loss_coef=0.001",
    "steps=2",
    "eval_every=2",
    "checkpoint.every=0",  # one checkpoint, after the last step: the split experts written whole
    "save_model=false",
]
EP = ["actor.expert_parallel=2", "workers.actor_dp=2", "workers.actor_cpus=0.5", "workers.rollout_cpus=0.5"]
COMPARED = ("actor/loss", "actor/pg_loss", "actor/kl", "actor/grad_norm", "reward/mean")


def command(data, output, run_name: str, *extra: str) -> list[str]:
    return roll_train("grpo.yaml", output, run_name, *MOE, *data, *extra)


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory):  # noqa: F811 (data: test_resume's fixture)
    output = tmp_path_factory.mktemp("expert_parallel")
    run(command(data, output, "ep2", *EP))
    run(command(data, output, "ep1", "workers.backend=local"))
    return {name: [r for r in metrics(output / name) if "actor/loss" in r] for name in ("ep2", "ep1")} | {
        "output": output
    }


def test_the_actor_splits_its_experts_and_the_reference_does_not():
    from roll_lite.workers.model_worker import strategy_config

    config = load_config(None, [*MOE, *EP])
    assert strategy_config(config, "actor").expert_parallel == 2
    assert strategy_config(config, "reference").expert_parallel == 1


def test_every_step_equals_the_run_at_ep1(runs):
    split, whole = runs["ep2"], runs["ep1"]
    assert len(split) == len(whole) == 2
    assert whole[-1]["actor/kl"] > 0 and whole[-1]["actor/grad_norm"] > 0  # the reference and the update mattered
    aux = sorted(key for key in whole[-1] if key.startswith("actor/moe_"))
    assert aux, sorted(whole[-1])
    for step, (a, b) in enumerate(zip(split, whole), start=1):
        for key in (*COMPARED, *aux):
            assert a[key] == pytest.approx(b[key], rel=2e-5, abs=1e-7), f"step {step}: {key}"
    assert (runs["output"] / "ep2" / "checkpoints" / "step_2").is_dir()
