"""An MoE policy through roll-train (docs/moe.md): GRPO on a tiny Qwen3-MoE built from the `model` keys, with the
load-balancing and z-losses and router replay from the hf engine (actor.router_replay=rollout), one process
(workers.backend=local).

The engine samples one step ahead (rollout.async_steps=1) at a large learning rate, so from step 2 on it routes with
weights an update older than the trainer's: its recorded experts differ from those the trainer's routers choose
(moe/own_routing_drift > 0). With replay (packed micro-batches) the trainer uses the engine's experts for every
recorded (token, layer) (moe/routing_drift = 0); with router_replay=compare (two mini-batches: measured at the
old-log-prob forward) it routes on its own and the drift shows (routing_drift = own_routing_drift > 0). A run
resumed from the replay run's step-2 checkpoint repeats its steps 3 and 4 bit for bit.
"""

import pytest
from test_resume import (
    data,  # noqa: F401 (a fixture)
    metrics,
    run,
    without_timings,
)
from tiny_moe import TINY_MOE, roll_train

MOE = [
    *TINY_MOE,
    "sft.steps=0",
    "workers.torch_threads=1",
    "workers.backend=local",
    "reward.functions={token_accuracy: 1.0}",
    "rollout.prompts_per_step=2",
    "rollout.num_samples=4",
    "rollout.async_steps=1",
    "algorithm.rollout_is=token",
    "actor.lr=1e-2",
    "actor.moe_aux_loss_coef=0.01",
    "actor.moe_z_loss_coef=0.001",
    "eval_every=4",
    "checkpoint.every=2",
    "checkpoint.keep_last=null",
    "save_model=false",
]
STEPS = 4
# packed micro-batches: the recorded routing is packed as the tokens are
REPLAY = [f"steps={STEPS}", "actor.router_replay=rollout", "actor.use_packing=true"]


def command(data, output, run_name: str, *extra: str) -> list[str]:
    return roll_train("grpo.yaml", output, run_name, *MOE, *data, *extra)


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory):  # noqa: F811 (data: test_resume's fixture)
    output = tmp_path_factory.mktemp("moe")
    run(command(data, output, "replay", *REPLAY))
    run(command(data, output, "compare", "steps=2", "actor.router_replay=compare", "algorithm.mini_batches=2"))
    run(command(data, output, "old", "steps=2", "actor.router_replay=old", "algorithm.mini_batches=2"))
    step_2 = output / "replay" / "checkpoints" / "step_2"
    run(command(data, output, "resumed", *REPLAY, f"resume={step_2}"))
    names = ("replay", "compare", "old", "resumed")
    runs = {name: [r for r in metrics(output / name) if r["step"] >= 1] for name in names}
    return {**runs, "output": output}


def test_with_replay_the_trainer_uses_the_engines_experts_where_its_own_routers_would_not(runs):
    replay = runs["replay"]
    assert [r["step"] for r in replay] == list(range(1, STEPS + 1))
    for record in replay:
        assert record["moe/routed_tokens"] > 0
        assert record["moe/routing_drift"] == 0 and record["moe/routing_drift_tokens"] == 0
    # step 1 samples with the trainer's own weights; then the engine is an update behind and routes otherwise
    assert replay[0]["moe/own_routing_drift"] == 0
    assert all(r["moe/own_routing_drift"] > 0.05 for r in replay[1:]), [r["moe/own_routing_drift"] for r in replay]


def test_without_replay_the_drift_is_the_routers_own(runs):
    """Two mini-batches a step: the drift is measured at the old-log-prob forward, over the whole batch."""
    compare = runs["compare"]
    assert compare[0]["moe/routing_drift"] == 0  # step 1: the engine has the trainer's weights
    assert compare[1]["moe/routing_drift"] == compare[1]["moe/own_routing_drift"] > 0.05
    assert all(r["moe/routed_tokens"] > r["response_length/mean"] * 8 for r in compare)  # prompts too, all 8 rows


def test_with_replay_old_the_second_mini_batch_keeps_the_routing_of_the_old_log_probs(runs):
    """R2 (actor.router_replay=old: the engine records nothing): the old-log-prob forward records the trainer's own
    routing; the second mini-batch, an update later, replays it where its routers would choose otherwise (a step's
    training metrics are its last mini-batch's)."""
    old = runs["old"]
    assert [r["step"] for r in old] == [1, 2]
    for record in old:
        assert record["moe/routed_tokens"] > record["response_length/mean"] * 4  # prompts too, the 4 rows trained
        assert record["moe/routing_drift"] == 0
        assert record["moe/own_routing_drift"] > 0, record["moe/own_routing_drift"]
        assert record["moe/load/layer0/max"] >= 1  # the load of the trainer's routing


def test_the_auxiliary_losses_are_logged_and_the_policy_learns(runs):
    for record in runs["replay"]:
        assert record["actor/moe_load_balancing_loss"] > 0.5  # E/L · Σ f·P: 1 when balanced
        assert record["actor/moe_z_loss"] > 0
        assert record["actor/grad_norm"] > 0  # the aux losses alone give a gradient when every group ties
    assert any(r["actor/pg_loss"] != 0 for r in runs["replay"])


def test_the_engines_expert_load_is_logged_per_layer(runs):
    """moe/load/layer{l}/expert{e}: shares of each layer's routed slots that sum to 1; .../max: E × the largest."""
    for record in runs["replay"] + runs["compare"]:
        for layer in range(2):
            shares = [record[f"moe/load/layer{layer}/expert{e}"] for e in range(4)]
            assert sum(shares) == pytest.approx(1.0) and min(shares) >= 0
            assert record[f"moe/load/layer{layer}/max"] == pytest.approx(4 * max(shares))
        assert "moe/load/layer2/expert0" not in record
    curves = (runs["output"] / "replay" / "curves.svg").read_text()
    assert "moe/load/layer0/max" in curves and "moe/load/layer1/max" in curves


def test_resumed_from_a_checkpoint_the_replayed_steps_repeat_bit_for_bit(runs):
    resumed = runs["resumed"]  # its metrics file starts as the checkpoint's: steps 1 and 2 of the replay run
    assert [r["step"] for r in resumed] == list(range(1, STEPS + 1))
    assert without_timings(resumed) == without_timings(runs["replay"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["actor.router_replay=always"], "actor.router_replay: 'always' is not one of null, compare, rollout, old"),
        (["actor.router_replay=rollout"], "actor.router_replay: model.model_type=qwen2 is a dense architecture"),
        (
            ["rollout.engine=vllm", "workers.gpus_per_rank=1"],
            "actor.router_replay: rollout needs the engine's routed experts",
        ),
        (["rollout.engine=vllm"], "rollout.engine: vLLM 0.32's CPU build generates from an MoE policy, but its log"),
        (["rollout.exact=true", "actor.param_dtype=float32"], "actor.router_replay: rollout.exact"),
        (
            ["actor.router_replay=old", "actor.sequence_parallel=2", "workers.actor_dp=2"],
            "actor.sequence_parallel: 2 with actor.router_replay: MoE router replay",
        ),
        (["critic.router_replay=rollout"], "critic.router_replay: only the actor replays"),
        (["model.num_experts_per_tok=9"], "model.num_experts_per_tok: must be between 1 and model.num_experts=8"),
    ],
)
def test_what_cannot_replay_is_a_config_error_naming_the_key(overrides, message):
    from roll_lite.config import ConfigError, load_config

    moe = [] if "qwen2" in message else ["model.model_type=qwen3_moe", "actor.router_replay=rollout"]
    with pytest.raises(ConfigError, match=message):
        load_config(None, [*moe, *overrides])


def test_replay_old_needs_no_engine_routing_so_vllm_on_gpus_may_sample():
    from roll_lite.config import load_config

    config = load_config(
        None,
        ["model.model_type=qwen3_moe", "actor.router_replay=old", "rollout.engine=vllm", "workers.gpus_per_rank=1"],
    )
    assert config.actor.router_replay == "old" and config.rollout.engine == "vllm"


def test_a_pretrained_dense_model_cannot_replay():
    from roll_lite.pipelines.preflight import _check_moe
    from transformers import PretrainedConfig

    from roll_lite.config import ConfigError, load_config

    config = load_config(None, ["model.model_type=qwen3_moe", "actor.moe_aux_loss_coef=0.1"])
    _check_moe(config, PretrainedConfig(num_experts=4))
    with pytest.raises(ConfigError, match="actor.moe_aux_loss_coef: model.pretrained_path's config.json names no"):
        _check_moe(config, PretrainedConfig())


def test_dynamic_samplings_rounds_pad_the_routing_with_no_expert():
    """algorithm.dynamic_sampling concatenates rounds of different widths: routed_experts pads with -1 (replay then
    keeps the router's own choice there), its rows unchanged."""
    import torch
    from roll_lite.pipelines.dapo import concat_padded

    from roll_lite.data.sequences import build_sequence_batch, token_aligned_experts

    rounds = []
    for responses in ([[4, 5]], [[6, 7, 8, 9]]):
        batch = build_sequence_batch([[1, 2]], responses, pad_token_id=0)
        tokens = int(batch["attention_mask"].sum())
        experts = torch.arange(tokens * 2 * 2).reshape(tokens, 2, 2) % 4
        batch.batch["routed_experts"] = token_aligned_experts(batch["attention_mask"], [experts])
        rounds.append(batch)
    joined = concat_padded(rounds, pad_token_id=0)
    assert joined["routed_experts"].shape == (2, 6, 2, 2)
    assert torch.equal(joined["routed_experts"][0, :4], rounds[0]["routed_experts"][0])
    assert (joined["routed_experts"][0, 4:] == -1).all()
    assert torch.equal(joined["routed_experts"][1], rounds[1]["routed_experts"][0])


def test_expert_load_counts_real_recorded_tokens_only():
    """Padding (attention_mask 0) and unrecorded tokens (-1) take no share."""
    import torch
    from roll_lite.pipelines.moe_routing import expert_load_metrics

    from roll_lite.config import load_config
    from roll_lite.data import DataProto

    experts = torch.tensor([[[[0, 1]], [[0, 2]], [[-1, -1]]], [[[0, 3]], [[3, 3]], [[1, 1]]]], dtype=torch.int16)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    config = load_config(None, ["model.model_type=qwen3_moe", "model.num_experts=4"])
    metrics = expert_load_metrics(DataProto({"routed_experts": experts, "attention_mask": mask}), config)
    # 3 recorded real tokens × k=2: expert 0 three times, 1, 2 and 3 once each
    assert [metrics[f"moe/load/layer0/expert{e}"] for e in range(4)] == [0.5, 1 / 6, 1 / 6, 1 / 6]
    assert metrics["moe/load/layer0/max"] == 2.0


def test_vllm_gets_the_causal_lm_architecture_of_a_built_config():
    """A config built from the `model` keys names no architecture; vLLM would take qwen3_moe's base model (a pooling
    model) and fail to start (roll_lite/rollout/vllm_start.py)."""
    from transformers import AutoConfig

    from roll_lite.rollout.vllm_start import causal_lm_architecture

    built = AutoConfig.for_model("qwen3_moe")
    assert not built.architectures
    assert causal_lm_architecture(built).architectures == ["Qwen3MoeForCausalLM"]
    assert not built.architectures  # a copy
    named = AutoConfig.for_model("qwen2", architectures=["Qwen2ForCausalLM"])
    assert causal_lm_architecture(named) is named


def test_a_pretrained_moe_with_vllm_on_cpu_is_refused():
    from roll_lite.pipelines.preflight import _check_moe
    from transformers import PretrainedConfig

    from roll_lite.config import ConfigError, load_config

    config = load_config(None, ["rollout.engine=vllm"])
    _check_moe(config, PretrainedConfig())  # dense: fine
    with pytest.raises(ConfigError, match="rollout.engine: vLLM 0.32's CPU build .* names experts"):
        _check_moe(config, PretrainedConfig(num_local_experts=4))
