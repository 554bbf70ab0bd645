"""Router replay through multi-turn trajectories (docs/moe.md): each token of a trajectory keeps the experts of the
engine's forward that first read it (roll_lite/rollout/engine.py merge_routing), and the batch's
`routed_experts` is aligned with its input_ids.

- merge_routing by hand: a turn's sampled tokens keep their decoding steps' experts, the prompt, the observations
  and the previous turn's last token take the next prefill's, and nothing read stays -1.
- roll-train on configs/multiturn.yaml with a tiny Qwen3-MoE (workers.backend=local): with
  actor.router_replay=compare the trainer, at the engine's weights, routes every recorded token as the engine did
  (an alignment off by one token would differ on most of them); with rollout the trainer uses the recorded experts
  everywhere (moe/routing_drift 0), and its log-probs match the engine's.
"""

import pytest
import torch
from test_resume import metrics, run
from tiny_moe import TINY_MOE, roll_train

from roll_lite.environments.turns import Trajectory, trajectory_batch
from roll_lite.rollout.engine import merge_routing

MOE = [
    *TINY_MOE,
    "workers.torch_threads=1",
    "workers.backend=local",
    "sft.steps=0",
    "rollout.prompts_per_step=2",
    "rollout.num_samples=2",
    "environment.max_concurrent=1",
    "environment.max_turns=3",
    "environment.kwargs.max_turns=3",
    "actor.use_packing=true",
    "eval_every=100",
    "data.eval_files=[]",
    "save_model=false",
]


def experts(*values: int) -> torch.Tensor:
    """One layer, top-1: [tokens, 1, 1]."""
    return torch.tensor(values, dtype=torch.int16).reshape(-1, 1, 1)


def test_each_token_keeps_the_experts_of_the_forward_that_first_read_it():
    # turn 1: prompt [p0 p1] prefilled (experts 1, 2), sampled [a b] decoded: a read by step 1 (3), b never (-1)
    first = merge_routing(None, experts(1, 2, 3, -1), context=2, kept=2)
    assert first.flatten().tolist() == [1, 2, 3, -1]
    # an observation [o] follows; turn 2's prefill re-routes all 5 tokens (p0 p1 a b o: 7 7 7 4 5), samples [c]
    second = merge_routing(first, experts(7, 7, 7, 4, 5, -1), context=5, kept=1)
    assert second.flatten().tolist() == [1, 2, 3, 4, 5, -1]
    # a turn cut to 2 of its 3 sampled tokens: the engine read its last kept one to sample the one cut off
    assert merge_routing(None, experts(1, 2, 3, -1), context=1, kept=2).flatten().tolist() == [1, 2, 3]
    trajectory = Trajectory([10, 11], [([12, 13], [0.0, 0.0]), ([14], None), ([15], [0.0])], routed_experts=second)
    trajectory.add_observation([16])  # not read by any forward yet
    batch = trajectory_batch([trajectory, Trajectory([10], [([12], [0.0])], routed_experts=experts(9))], 0)
    assert batch["routed_experts"].shape == (2, 7, 1, 1)
    assert batch["routed_experts"].flatten(1).tolist() == [[1, 2, 3, 4, 5, -1, -1], [9, -1, -1, -1, -1, -1, -1]]


def command(output, run_name: str, *extra: str) -> list[str]:
    return roll_train("multiturn.yaml", output, run_name, *MOE, *extra)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    output = tmp_path_factory.mktemp("moe_multi_turn")
    run(command(output, "replay", "steps=2", "actor.router_replay=rollout"))
    run(command(output, "compare", "steps=1", "actor.router_replay=compare", "algorithm.mini_batches=2"))
    return {name: [r for r in metrics(output / name) if r["step"] >= 1] for name in ("replay", "compare")}


def test_at_the_engines_weights_the_trainer_routes_every_recorded_token_as_the_engine_did(runs):
    (record,) = runs["compare"]
    assert record["env/turns"] > 1  # trajectories of several turns
    # every token but each trajectory's last (nothing read it): prompts, observations and sampled tokens
    assert record["moe/routed_tokens"] > 4 * record["response_length/mean"]
    assert record["moe/routing_drift"] <= 0.01, record["moe/routing_drift"]


def test_with_replay_the_trainer_uses_the_recorded_experts(runs):
    replay = runs["replay"]
    assert [r["step"] for r in replay] == [1, 2]
    for record in replay:
        assert record["env/turns"] > 1 and record["moe/routed_tokens"] > 0
        assert record["moe/routing_drift"] == 0 and record["moe/routing_drift_tokens"] == 0
        assert record["actor/rollout_logp_gap_max"] < 1e-4  # the engine's log-probs are the trainer's
