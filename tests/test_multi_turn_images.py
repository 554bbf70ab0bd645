"""Images in multi-turn conversations (docs/vision.md): roll-train's MultiTurnPipeline on a tiny Qwen2.5-VL
(workers.backend=local, the hf engine) playing color_cards, which shows a card in the first observation and
another in the third (tests/image_cards.py: the same game with rows whose third image is broken).

One run of 2 steps in this process, with a pipeline that records every generate call of the engine (its ids and
images) and the batch the actor trains on. The named test: a three-turn trajectory with an image in turns 1
and 3 has the same ids (and images) in the engine, in the trainer and in a fresh processor call on the whole
conversation; its negative control shows that a second expansion of the placeholders (TRL #6294, verl #3469)
fails it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image
from roll_lite.pipelines import multi_turn
from tiny_vlm import TINY_VLM

from roll_lite.environments.color_cards import ColorCards
from roll_lite.environments.contract import BadImage, BadReturn, checked_reset, checked_step
from roll_lite.rollout.images import check_expanded_once

REPO = Path(__file__).resolve().parents[1]
ROWS = [{"seed": 1}, {"seed": 2, "broken": "bytes"}, {"seed": 3}, {"seed": 4, "broken": "wide"}]
RUN = [
    *TINY_VLM,
    "pipeline=test_multi_turn_images:Recording",
    "environment.name=image_cards:Cards",
    "environment.max_turns=3",
    "environment.max_new_tokens_per_turn=4",
    "environment.max_trajectory_tokens=100",
    "environment.max_concurrent=1",
    "sft.steps=0",
    "workers.backend=local",
    "workers.torch_threads=1",
    "rollout.prompts_per_step=2",
    "rollout.num_samples=2",
    "algorithm.entropy_coef=0.01",  # a gradient every step, whatever the rewards
    "actor.lr=1e-2",
    "data.shuffle=false",
    "steps=2",
    "eval_every=100",
    "save_model=false",
    "checkpoint.enabled=false",
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
    """Every generate call of the engine (RecordingEngine) and the batch the actor trains on, with its episodes."""

    def play(self, rows, row_ids, params, split):
        engine_calls, multi_turn._EngineCalls = multi_turn._EngineCalls, RecordingEngine
        try:
            return super().play(rows, row_ids, params, split)
        finally:
            multi_turn._EngineCalls = engine_calls

    def train(self, group, batch, loss):
        if loss == "policy":
            TRAINED.append({"batch": batch, "episodes": list(self.kept)})
        return super().train(group, batch, loss)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from roll_lite.cli import main

    folder = tmp_path_factory.mktemp("cards")
    (folder / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    (folder / "eval.jsonl").write_text(json.dumps({"seed": 5}) + "\n")
    argv = ["--config", str(REPO / "configs/grpo.yaml"), *RUN, f"data.train_files={folder / 'rows.jsonl'}"]
    argv += [f"data.eval_files={folder / 'eval.jsonl'}", f"output_dir={folder / 'out'}"]
    assert main(argv) == 0
    lines = (folder / "out" / "cards" / "metrics.jsonl").read_text().splitlines()
    return list(map(json.loads, lines))


def processor():
    from roll_lite.model.vision_run import run_processor

    return run_processor()


def conversation(row: dict, episode, tokenizer) -> tuple[list[dict], list]:
    """The whole conversation as chat messages, replayed from the game and the model's turns, and its images."""
    game, messages, images = ColorCards(), [], []

    def user(observation):
        if isinstance(observation, str):
            return {"role": "user", "content": observation}
        images.extend(part["image"] for part in observation if part["type"] == "image")
        return {
            "role": "user",
            "content": [{"type": p["type"], **({"text": p["text"]} if "text" in p else {})} for p in observation],
        }

    messages.append(user(game.reset(seed=row["seed"])[0]))
    turns = [ids for ids, log_probs in episode.trajectory.pieces if log_probs is not None]
    for k, (ids, text) in enumerate(zip(turns, episode.turn_texts)):
        messages.append(
            {"role": "assistant", "content": tokenizer.decode(ids[:-1] if ids[-1] == tokenizer.eos_token_id else ids)}
        )
        if k + 1 < len(turns):
            messages.append(user(game.step(text)[0]))
    return messages, images


def fresh_call(messages: list[dict], images: list) -> dict:
    """A fresh processor call on the whole conversation: the chat template over every message, then the processor."""
    p = processor()
    text = p.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    return p(text=[text], images=images, return_tensors="pt")


def engine_call(ids: list[int], turn: list[int]) -> tuple[list[int], dict]:
    """(the ids the engine generated `turn` from, plus the turn; the images it had) of the call that sampled it."""
    prefix = ids[: len(ids) - len(turn)]
    for call in ENGINE:
        for prompt, entry, sampled in zip(call["prompts"], call["images"], call["sampled"]):
            if prompt == prefix and sampled[: len(turn)] == turn:
                return prompt + turn, entry
    raise AssertionError("no engine call sampled this turn")


def assert_same(engine: tuple[list[int], dict], trainer: tuple[list[int], dict], fresh: tuple[list[int], dict]) -> None:
    assert engine[0] == trainer[0] == fresh[0]
    for key in ("pixel_values", "image_grid_thw"):
        assert torch.equal(engine[1][key], trainer[1][key]) and torch.equal(trainer[1][key], fresh[1][key])


def complete_trajectories():
    """(row, its trajectory's ids and images as trained, its episode) of every trajectory that played 3 turns."""
    for step in TRAINED:
        batch = step["batch"]
        for row, episode in enumerate(step["episodes"]):
            if episode.fault is None:
                length = int(batch["attention_mask"][row].sum())
                ids = batch["input_ids"][row, :length].tolist()
                yield row, batch, (ids, batch.non_tensor_batch["image_inputs"][row]), episode


def test_a_three_turn_trajectory_with_images_in_turns_1_and_3_has_the_same_ids_in_engine_trainer_and_a_fresh_call(run):
    p = processor()
    tokenizer, image_token = p.tokenizer, p.image_token_id
    found = list(complete_trajectories())
    assert len(found) == 4  # the good row of each step, 2 samples each
    for row, batch, trainer, episode in found:
        assert episode.num_turns == 3 and len(episode.trajectory.images) == 2  # images in turns 1 and 3
        turns = [ids for ids, log_probs in episode.trajectory.pieces if log_probs is not None]
        engine = engine_call(trainer[0], turns[-1])
        messages, images = conversation(ROWS[episode.key[1]], episode, tokenizer)
        encoded = fresh_call(messages, images)
        fresh = encoded["input_ids"][0].tolist()
        # the template ends the last assistant turn with <eos> and a newline, after the trajectory's last token
        tail = tokenizer.decode(fresh[len(trainer[0]) :])
        assert tail == ("\n" if turns[-1][-1] == tokenizer.eos_token_id else "<eos>\n")
        assert_same(engine, trainer, (fresh[: len(trainer[0])], encoded))
        ids = torch.tensor(trainer[0])
        check_expanded_once(ids, trainer[1]["image_grid_thw"], image_token, 2)
        assert int((ids == image_token).sum()) == int(trainer[1]["image_grid_thw"].prod(-1).sum()) // 4 == 8
        # the engine saw the images grow in order: turns 1 and 2 the first card, turn 3 both
        seen = [
            engine_call(trainer[0][: len(episode.trajectory.prompt_ids) + end + 1], t)[1]
            for t, end in zip(turns, episode.turn_ends)
        ]
        assert [len(entry["image_grid_thw"]) for entry in seen] == [1, 1, 2]
        first = len(seen[0]["pixel_values"])
        assert torch.equal(seen[2]["pixel_values"][:first], seen[0]["pixel_values"])
        # the loss mask: exactly the sampled tokens, no image token and no environment token
        mask = batch["model_mask"][row, : len(ids)].bool()
        assert not (mask & (ids == image_token)).any()
        assert ids[mask].tolist() == [token for turn in turns for token in turn]


def test_a_second_expansion_of_the_placeholders_fails_the_named_test(run):
    """The negative control: the trainer expanding the engine's already expanded placeholders again (each image
    token taken for a placeholder: TRL #6294, verl #3469) gives other ids, which the comparison and
    check_expanded_once both catch."""
    p = processor()
    row, batch, trainer, episode = next(complete_trajectories())
    turns = [ids for ids, log_probs in episode.trajectory.pieces if log_probs is not None]
    engine = engine_call(trainer[0], turns[-1])
    grid = trainer[1]["image_grid_thw"]
    per_image = int(grid[0].prod()) // 4
    doubled = [t for token in trainer[0] for t in ([token] * per_image if token == p.image_token_id else [token])]
    assert len(doubled) == len(trainer[0]) + 8 * (per_image - 1) > len(trainer[0])
    with pytest.raises(AssertionError):
        assert_same(engine, (doubled, trainer[1]), engine)
    with pytest.raises(ValueError, match="expanded exactly once"):
        check_expanded_once(torch.tensor(doubled), grid, p.image_token_id, 2)


def test_the_run_trains_and_a_bad_image_costs_one_trajectory(run):
    """Both steps train, the engine's log-probs are the trainer's (the same ids and images); each step's broken
    row (bytes that are no image, found in the environment's process; an image the processor refuses, found in
    the driver) ends its 2 trajectories as the fault bad_image, counted, and the run goes on."""
    assert [r["step"] for r in run] == [0, 1, 2]
    assert all(r["eval/turns"] == 3 and "eval/faults/bad_image" not in r for r in (run[0], run[-1]))  # greedy
    for record in run[1:]:
        assert torch.isfinite(torch.tensor(record["actor/pg_loss"])) and record["actor/grad_norm"] > 0
        assert record["actor/rollout_logp_gap_max"] < 1e-5, record
        assert record["env/faults/bad_image"] == 2.0
    errors = [[e.error for e in step["episodes"] if e.fault == "bad_image"] for step in TRAINED]
    assert len(errors[0]) == len(errors[1]) == 2
    assert all("observation[0]['content']: part 0: its 12 bytes cannot be read as an image" in e for e in errors[0])
    assert all("the processor refused the observation" in e for e in errors[1])
    for step in TRAINED:  # a faulted trajectory (zero reward) keeps its turns so far: the engine's ids and image
        for row, episode in enumerate(step["episodes"]):
            if episode.fault is not None:
                length = int(step["batch"]["attention_mask"][row].sum())
                ids = step["batch"]["input_ids"][row, :length].tolist()
                turn = [t for t, lp in episode.trajectory.pieces if lp is not None][-1]
                prompt, entry = engine_call(ids, turn)
                assert prompt == ids and torch.equal(
                    entry["pixel_values"], step["batch"].non_tensor_batch["image_inputs"][row]["pixel_values"]
                )


def test_observations_with_images_are_checked_in_the_environments_process():
    from roll_lite.environments.episodes import EpisodeLoop

    red = Image.new("RGB", (8, 8), (255, 0, 0))
    observation, _ = checked_reset(([{"type": "image", "image": red.convert("L")}, {"type": "text", "text": "hi"}], {}))
    assert observation[0]["role"] == "user" and observation[0]["content"][0]["image"].mode == "RGB"
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image", "image": b"\x89PNG"}]}]
    with pytest.raises(BadImage, match=r"step's observation\[0\]\['content'\]: part 1: its 4 bytes cannot be read"):
        checked_step((messages, 0.0, False, False, {}))
    for part, error in (
        ({"type": "image"}, "an image part without its 'image'"),
        ({"type": "image", "image": 3}, "a int, not an image"),
        ({"type": "image", "image": "/no/such.png"}, "no such image file '/no/such.png'"),
        ({"type": "video"}, "is not {'type': 'text'"),
    ):
        with pytest.raises(BadReturn, match=error):
            checked_reset(([{"role": "user", "content": [part]}], {}))
    # a text policy shown an image: the same fault, found in the driver
    with pytest.raises(BadImage, match="the observation holds an image, but the policy reads no images"):
        EpisodeLoop._no_images(observation)


def test_the_ors_and_openenv_adapters_give_image_parts():
    """environment.name=ors: an image block of the server's answer (base64) becomes an image part, in block
    order; openenv: the images of kwargs.image_key's field come before the text. The blocks stand in for the
    SDK's TextBlock / ImageBlock (their type, text and data; importing the SDK costs seconds)."""

    def TextBlock(text):
        return SimpleNamespace(type="text", text=text)

    def ImageBlock(data, mime):
        return SimpleNamespace(type="image", data=data, mimeType=mime)

    import base64
    import io
    from types import SimpleNamespace

    from roll_lite.environments.openenv_env import with_images
    from roll_lite.environments.ors_env import observation_of

    png = io.BytesIO()
    Image.new("RGB", (8, 8), (0, 0, 255)).save(png, format="PNG")
    data = base64.b64encode(png.getvalue()).decode()
    # environment.name=openenv with kwargs.image_key: the field's base64 images, before the text
    assert with_images("hi", None, "u") == "hi"
    assert with_images("hi", [data], "u") == [
        {"type": "image", "image": png.getvalue()},
        {"type": "text", "text": "hi"},
    ]
    with pytest.raises(BadImage, match="openenv server u: image 1 of the observation is not base64"):
        with_images("hi", [data, "%%"], "u")
    assert observation_of([TextBlock("a"), TextBlock("b")], "u") == "a\nb"
    parts = observation_of([ImageBlock(data, "image/png"), TextBlock("color?")], "u")
    assert parts == [{"type": "image", "image": png.getvalue()}, {"type": "text", "text": "color?"}]
    (message,), _ = checked_reset((parts, {}))
    assert message["content"][0]["image"].getpixel((0, 0)) == (0, 0, 255)
    with pytest.raises(BadImage, match="ors server u: an image block whose data is not base64"):
        observation_of([ImageBlock("not base64!", "image/png")], "u")


def test_a_multi_turn_run_on_a_vlm_takes_the_pixel_bounds_and_refuses_image_rows():
    from roll_lite.config import ConfigError, load_config

    config = load_config(str(REPO / "configs/grpo.yaml"), [*RUN, "data.min_pixels=16", "data.max_pixels=256"])
    assert (config.data.min_pixels, config.data.max_pixels) == (16, 256)
    with pytest.raises(ConfigError, match="data.image_key: a multi-turn run's rows seed its environments"):
        load_config(str(REPO / "configs/grpo.yaml"), [*RUN, "data.image_key=images"])
    # episodes ahead (tests/test_async_episodes_images.py) need Ray: workers.backend=local refuses them
    with pytest.raises(ConfigError, match="rollout.fully_async: multi-turn rollouts ahead are not supported under"):
        load_config(str(REPO / "configs/grpo.yaml"), [*RUN, "rollout.fully_async=true"])
