"""Router replay through partial rollouts (rollout.fully_async, docs/moe.md): a row continued under new weights keeps,
for each token, the experts of the forward that first read it (roll_lite/rollout/partial.py with
roll_lite/rollout/engine.py merge_routing), through a checkpoint's JSON state too.

- A scripted engine that routes every token it reads to its weight version: after a cohort advanced across versions
  each token's recorded expert is the version that read it first (the prompt: the first call's; a sampled token: the
  version that sampled the token after it; the last token: -1), under continue and under drop.
- roll-train GRPO on a tiny Qwen3-MoE, fully async (segments of 2 tokens, staleness 1, workers.backend=local): rows
  cross weight versions, the trainer's routers would choose other experts, and under replay it uses the recorded
  ones for every recorded (token, layer).
"""

import json

import pytest
import torch
from test_moe_run import command
from test_partial_rollouts import EOS, PARAMS, PROMPTS, ScriptedEngine
from test_resume import data, metrics, run  # noqa: F401 (data: a fixture)

from roll_lite.rollout import Completions, SamplingParams
from roll_lite.rollout.partial import PartialRollouts


class RoutingEngine(ScriptedEngine):
    """The scripted engine, recording for each row one layer, top-1: its weight version on every token a forward
    read (the prefill's context and each sampled token but the last), -1 on the last."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Completions:
        completions = super().generate(prompts, params)
        contexts = [len(p) for p in prompts for _ in range(params.num_samples)]
        completions.routed_experts = [
            torch.tensor([self.version] * (context + len(row) - 1) + [-1], dtype=torch.int16).reshape(-1, 1, 1)
            for context, row in zip(contexts, completions.token_ids)
        ]
        return completions


def advanced(on_update: str) -> Completions:
    partial, engine = PartialRollouts(EOS), RoutingEngine(version=3)
    partial.admit(1, PROMPTS, PARAMS, on_update)
    partial.advance(1, 2, 3, engine.generate)
    restored = PartialRollouts(EOS)  # a checkpoint in between (its state is JSON)
    restored.load_state_dict(json.loads(json.dumps(partial.state_dict())))
    for version in (4, 5):
        engine.version = version
        restored.advance(1, 2 if version == 4 else None, version, engine.generate)
    return restored.take(1)


@pytest.mark.parametrize("on_update", ["continue", "drop"])
def test_each_token_keeps_the_experts_of_the_weights_that_first_read_it(on_update):
    taken = advanced(on_update)
    prompts = [p for p in PROMPTS for _ in range(PARAMS.num_samples)]
    assert taken.routed_experts is not None and any(len(set(v)) > 1 for v in taken.token_versions) == (
        on_update == "continue"
    )
    for prompt, versions, experts in zip(prompts, taken.token_versions, taken.routed_experts):
        assert experts.shape == (len(prompt) + len(versions), 1, 1)
        # the prompt: the call that first read it (under drop, the call the row restarted with: its first token's)
        expected = [versions[0]] * len(prompt) + versions[1:] + [-1]
        assert experts.flatten().tolist() == expected


@pytest.fixture(scope="module")
def replay_run(data, tmp_path_factory):  # noqa: F811 (data: test_resume's fixture)
    output = tmp_path_factory.mktemp("moe_partial")
    extra = ["rollout.async_steps=0", "rollout.fully_async=true", "rollout.max_staleness=1"]
    extra += ["rollout.segment_tokens=2", "steps=3", "actor.router_replay=rollout", "actor.use_packing=true"]
    run(command(data, output, "partial", *extra, "checkpoint.every=100"))
    return [r for r in metrics(output / "partial") if r["step"] >= 1]


def test_across_weight_versions_the_trainer_replays_the_recorded_experts(replay_run):
    assert [r["step"] for r in replay_run] == [1, 2, 3]
    assert any(r["rollout/mixed_version_share"] > 0 for r in replay_run)  # rows that crossed a weight update
    assert any(r["moe/own_routing_drift"] > 0.05 for r in replay_run)  # the trainer's routers would differ
    for record in replay_run:
        assert record["moe/routed_tokens"] > 0
        assert record["moe/routing_drift"] == 0 and record["moe/routing_drift_tokens"] == 0
