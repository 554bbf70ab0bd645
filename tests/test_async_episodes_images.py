"""Multi-turn episodes ahead with images (docs/vision.md): roll-train's MultiTurnPipeline with
rollout.fully_async=true and max_staleness=1 on a tiny Qwen2.5-VL playing color_cards (an image in turns 1 and 3),
so that step 2's trajectories take their first turn while step 1 trains and go on with the weights of step 1.

workers.backend=local refuses this mode (its rounds ahead run in a thread while the actor trains, and local holds
the engine's and the actor's random generators apart only between calls made one at a time). Here, to run it in
this process, the refusal is taken off and the rounds ahead are played in the driver's thread, before the step
trains: what is played is the same (rounds, not timing, decide it; pipelines/async_episodes.py), only not beside
the training. On Ray workers the loops make the same engine calls through the RolloutClient, from a thread (run
by hand, docs/vision.md "Limits").

One run of 2 steps, checkpointed after step 1 with step 2's trajectories in flight; it records every generate call
(its ids and images) and every batch the actor trains on, then a second run resumes from that checkpoint.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from roll_lite.pipelines import async_episodes, multi_turn
from test_multi_turn_images import conversation, fresh_call, processor
from tiny_vlm import TINY_VLM

from roll_lite.config import backend
from roll_lite.rollout.images import check_expanded_once

REPO = Path(__file__).resolve().parents[1]
ROWS = [{"seed": 1}, {"seed": 3}]
RUN = [
    *TINY_VLM,
    "pipeline=test_async_episodes_images:Recording",
    "environment.name=color_cards",
    "environment.max_turns=3",
    "environment.max_new_tokens_per_turn=4",
    "environment.max_trajectory_tokens=100",
    "environment.max_concurrent=1",
    "sft.steps=0",
    "workers.backend=local",
    "workers.torch_threads=1",
    "rollout.fully_async=true",
    "rollout.max_staleness=1",
    "rollout.segment_turns=1",
    "rollout.prompts_per_step=1",
    "rollout.num_samples=2",
    "algorithm.entropy_coef=0.01",  # a gradient every step, whatever the rewards
    "actor.lr=1e-2",
    "data.shuffle=false",
    "steps=2",
    "eval_every=100",
    "data.eval_files=[]",
    "save_model=false",
    "checkpoint.every=1",
    "checkpoint.keep_last=null",
    "run_name=cards",
]
ENGINE: list[dict] = []  # every generate call: its prompts, their images, the sampled ids
TRAINED: list[dict] = []  # every step: the batch the actor trains on, and its episodes


class RecordingEngine(multi_turn._EngineCalls):
    def start_generate(self, prompts, params, *images):
        entries = images[0] if images else [None] * len(prompts)
        ENGINE.append({"prompts": [list(p) for p in prompts], "images": list(entries)})
        return super().start_generate(prompts, params, *images)

    def result(self, handle):
        completions = super().result(handle)
        ENGINE[-1]["sampled"] = completions.token_ids
        return completions


class Recording(multi_turn.MultiTurnPipeline):
    def train(self, group, batch, loss):
        if loss == "policy":
            TRAINED.append({"batch": batch, "episodes": list(self.kept)})
        return super().train(group, batch, loss)


class RoundsInTheDriversThread(async_episodes.RoundsAhead):
    """RoundsAhead, its rounds played before it returns (the same rounds; not beside the training)."""

    def __init__(self, loops, rounds, greedy):
        super().__init__([], rounds, greedy)
        self.thread.join()
        self._play(loops, rounds, greedy)


LOCAL_PROBLEMS = backend.local_problems


def local_problems(config):
    """workers.backend=local's refusals, but that of multi-turn rollouts ahead."""
    return [p for p in LOCAL_PROBLEMS(config) if not p[1].startswith("multi-turn rollouts ahead")]


def roll_train(folder: Path, *overrides: str) -> list[dict]:
    from roll_lite.cli import main

    argv = ["--config", str(REPO / "configs/grpo.yaml"), *RUN, f"data.train_files={folder / 'rows.jsonl'}"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(backend, "local_problems", local_problems)
        patch.setattr(async_episodes, "RoundsAhead", RoundsInTheDriversThread)
        patch.setattr(multi_turn, "_EngineCalls", RecordingEngine)
        assert main([*argv, f"output_dir={folder / 'out'}", *overrides]) == 0
    lines = (folder / "out" / "cards" / "metrics.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record["step"] > 0]  # step 0: the empty held-out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cards")
    (folder / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return roll_train(folder), folder / "out" / "cards"


def engine_call(ids: list[int], turn: list[int]) -> dict:
    """The images of the engine call that sampled `turn` after `ids`' other tokens."""
    prefix = ids[: len(ids) - len(turn)]
    for call in ENGINE:
        for prompt, entry, sampled in zip(call["prompts"], call["images"], call["sampled"]):
            if prompt == prefix and sampled[: len(turn)] == turn:
                return entry
    raise AssertionError("no engine call sampled this turn")


def test_trajectories_ahead_keep_their_images_across_the_weight_update(run):
    """Every trained trajectory's ids and images equal a fresh processor call on its conversation; the engine had
    every image so far on each turn; step 2's trajectories took turn 1 with weights 0 and the rest with weights 1."""
    records, _ = run
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert torch.isfinite(torch.tensor(record["actor/pg_loss"])) and record["actor/grad_norm"] > 0
    assert records[1]["rollout/staleness"] == 1 and records[1]["rollout/mixed_version_share"] > 0
    p = processor()
    tokenizer = p.tokenizer
    for step, trained in enumerate(TRAINED[:2], start=1):
        batch = trained["batch"]
        for row, episode in enumerate(trained["episodes"]):
            t = episode.trajectory
            assert episode.fault is None and episode.num_turns == 3 and len(t.images) == 2
            assert episode.turn_versions == ([0, 0, 0] if step == 1 else [0, 1, 1])
            ids = batch["input_ids"][row, : int(batch["attention_mask"][row].sum())].tolist()
            images = batch.non_tensor_batch["image_inputs"][row]
            messages, pictures = conversation(ROWS[episode.key[1]], episode, tokenizer)
            fresh = fresh_call(messages, pictures)
            assert fresh["input_ids"][0, : len(ids)].tolist() == ids
            for key in ("pixel_values", "image_grid_thw"):
                assert torch.equal(images[key], fresh[key])
            check_expanded_once(torch.tensor(ids), images["image_grid_thw"], p.image_token_id, 2)
            turns = [piece for piece, log_probs in t.pieces if log_probs is not None]
            seen = [
                engine_call(ids[: len(t.prompt_ids) + end + 1], turn) for turn, end in zip(turns, episode.turn_ends)
            ]
            assert [len(entry["image_grid_thw"]) for entry in seen] == [1, 1, 2]  # every image so far, each turn
            assert torch.equal(seen[2]["pixel_values"], images["pixel_values"])
            assert torch.equal(seen[0]["pixel_values"], images["pixel_values"][: len(seen[0]["pixel_values"])])


def test_a_checkpoint_holds_the_trajectories_in_flight_with_their_images_and_a_resume_repeats_step_2(run):
    """Step 1's checkpoint pickles step 2's episodes after their first turn, images included (the processor's
    inputs, not the observations' pictures: the environments are replayed, the images are not re-encoded); a run
    resumed from it trains step 2 on the same ids and images, with the same loss. The control: a trajectory kept
    without its images (ids only) fails the engine's check."""
    records, folder = run
    saved = pickle.loads((folder / "checkpoints" / "step_1" / async_episodes.EPISODES_IN_FLIGHT).read_bytes())
    episodes = saved["loops"][2]["episodes"]
    assert [e.num_turns for e in episodes.values()] == [1, 1]
    step_2 = TRAINED[1]
    for episode in step_2["episodes"]:
        held = episodes[episode.key].trajectory
        assert len(held.images) == 1 and torch.equal(
            held.images[0]["pixel_values"], episode.trajectory.images[0]["pixel_values"]
        )
    # the control: the same trajectory kept without its images (ids only) is refused by the engine's check
    ids = torch.tensor(held.prompt_ids + held.response_ids)
    with pytest.raises(ValueError, match="expanded exactly once"):
        check_expanded_once(ids, None, processor().image_token_id, 2)
    (folder / "checkpoints" / "step_2").rename(folder.parent / "step_2_moved")  # as if killed in step 2
    (folder / "checkpoints" / "latest").write_text("step_1")
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    (folder / "metrics.jsonl").write_text("".join(line + "\n" for line in lines if json.loads(line)["step"] < 2))
    del TRAINED[2:]
    calls = len(ENGINE)
    resumed = roll_train(folder.parent.parent)
    assert [r["step"] for r in resumed] == [1, 2]
    first_turn = {len(e.trajectory.prompt_ids) for e in step_2["episodes"]}
    assert all(len(prompt) > max(first_turn) for call in ENGINE[calls:] for prompt in call["prompts"])  # turns 2, 3
    assert resumed[-1]["actor/pg_loss"] == records[1]["actor/pg_loss"]
    again = TRAINED[2]
    for key in ("input_ids", "attention_mask", "model_mask"):
        assert torch.equal(again["batch"][key], step_2["batch"][key])
    for a, b in zip(again["batch"].non_tensor_batch["image_inputs"], step_2["batch"].non_tensor_batch["image_inputs"]):
        assert torch.equal(a["pixel_values"], b["pixel_values"])
