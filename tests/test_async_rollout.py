"""rollout.async_steps: the books of the queue of generations launched ahead (no Ray). Real roll-train
processes generating one step ahead are in test_resume.py: the staleness they log, the weights that
sampled, and a resume whose batch generated ahead comes from the checkpoint."""

import json
from pathlib import Path

import pytest

from roll_lite.rollout import Completions
from roll_lite.rollout.ahead import RolloutQueue, staleness

REPO = Path(__file__).resolve().parents[1]


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


def test_generating_ahead_on_cpu_with_more_threads_than_cores_is_warned_about(monkeypatch):
    from roll_lite.pipelines.run_log import oversubscribed_cpu_warning

    from roll_lite.config import load_config

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    warning = oversubscribed_cpu_warning(load_config(str(REPO / "configs/grpo.yaml"), ["rollout.async_steps=1"]))
    assert "4 torch threads on 2 cores; set workers.torch_threads=1" in warning
    one_thread_each = ["rollout.async_steps=1", "workers.torch_threads=1"]
    assert oversubscribed_cpu_warning(load_config(str(REPO / "configs/grpo.yaml"), one_thread_each)) is None
