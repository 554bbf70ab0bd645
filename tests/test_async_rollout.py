"""rollout.async_steps: the queue's books (no Ray), and real roll-train processes generating one step
ahead: the staleness they log, the weights that sampled, and a kill + resume that continues the
uninterrupted run bit for bit (the generations launched ahead travel in the checkpoint)."""

import json
import random

import pytest

from roll_lite.checkpoint import layout
from roll_lite.rollout import Completions
from roll_lite.rollout.ahead import RolloutQueue, staleness
from test_resume import STEPS, assert_same_trajectory, command, data, metrics, run, run_until  # noqa: F401 (data: fixture)

ASYNC = ["rollout.async_steps=1", "algorithm.rollout_is=token"]


def test_the_queue_launches_each_step_once_up_to_async_steps_ahead():
    queue = RolloutQueue(async_steps=2)
    assert list(queue.steps_to_launch(1, last_step=10)) == [1, 2, 3]
    for step in (1, 2, 3):
        queue.add(step, [step], f"ref-{step}")
    assert list(queue.steps_to_launch(1, last_step=10)) == []
    assert queue.pop(1).result == "ref-1"
    assert list(queue.steps_to_launch(2, last_step=10)) == [4]
    assert list(queue.steps_to_launch(9, last_step=10)) == [4, 5, 6, 7, 8, 9, 10]  # never past the last step
    with pytest.raises(RuntimeError, match="launched twice"):
        queue.add(2, [2], "again")
    with pytest.raises(RuntimeError, match="no generation was launched for step 7"):
        queue.pop(7)
    on_policy = RolloutQueue(async_steps=0)
    assert list(on_policy.steps_to_launch(5, last_step=10)) == [5]


def test_the_queue_saves_only_fetched_generations_and_restores_them():
    queue = RolloutQueue(async_steps=1)
    queue.add(4, [7, 1], "a ref")
    with pytest.raises(RuntimeError, match="step 4 is not fetched"):
        queue.state_dict()
    queue.launched[4].result = Completions([[3, 2], [5]], [[-0.25, -1.5], [-0.125]], weight_version=2)
    restored = RolloutQueue(async_steps=3)
    restored.load_state_dict(json.loads(json.dumps(queue.state_dict())))
    launched = restored.pop(4)
    assert launched.rows == [7, 1] and launched.result == queue.launched[4].result
    assert staleness(4, launched.result) == 1  # the actor holds version 3 when step 4 begins


@pytest.fixture(scope="module")
def async_reference(data, tmp_path_factory):  # noqa: F811
    output = tmp_path_factory.mktemp("async")
    run(command(data, output, "ref", *ASYNC))
    return output / "ref"


def test_one_step_ahead_samples_with_the_previous_weights_and_logs_its_staleness(async_reference):
    records = metrics(async_reference)[1:]
    assert [r["rollout/staleness"] for r in records] == [0] + [1] * (STEPS - 1)
    # Step 1 samples with the actor's own weights (|Δ log p| is float32 noise); from step 3 the weights
    # that sampled are one update behind (step 1's update: zero advantages, no change), and the loss is
    # weighted by the importance ratio to them.
    assert records[0]["actor/rollout_logp_gap"] < 1e-5
    assert all(r["actor/rollout_logp_gap"] > 1e-4 for r in records[2:])
    assert all(r["actor/rollout_is_weight"] != 1.0 for r in records[2:])
    ahead = json.loads((layout.step_dir(async_reference, 2) / "rollouts_ahead.json").read_text())
    assert [(item["step"], item["weight_version"]) for item in ahead] == [(3, 1)]


def test_async_run_killed_and_resumed_equals_the_uninterrupted_one(data, async_reference, tmp_path):  # noqa: F811
    kill_after = random.randint(3, STEPS - 1)
    print(f"SIGKILL after step {kill_after}")
    run_until(command(data, tmp_path, "killed", *ASYNC), f"step {kill_after}/{STEPS} |")
    resumed = run(command(data, tmp_path, "killed", *ASYNC))
    assert "resumed from" in resumed.stderr
    assert_same_trajectory(metrics(tmp_path / "killed"), metrics(async_reference))
