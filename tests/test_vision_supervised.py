"""SFT, DPO and the SFT warm start on image rows through roll-train (docs/vision.md, "SFT and DPO on image rows"):
a tiny Qwen2.5-VL built from the `model` keys, rows with one or two images (data.image_key), each sequence's ids
the processor's (each image placeholder expanded once), its image inputs carried with it to the trainer and, for
DPO, to the reference worker. All in this process (workers.backend=local), two steps each.

The runs' pipelines record every batch the actor trains on. Checked: each step logs a finite loss and a gradient;
every row's ids up to its first target are a fresh processor call on its prompt (the RL prompt's ids, images
expanded once) with that call's image inputs, its targets are the answer's tokens and no image token; the two
sides of a pair share their prompt's image inputs; at step 0 the reference's log-probs (on the same images) are
the policy's. Bad image rows stop the run before it starts with a data error naming the key, file, row and image.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from PIL import Image
from roll_lite.pipelines.dpo import DPOPipeline
from roll_lite.pipelines.ppo import PPOPipeline
from roll_lite.pipelines.sft import SFTPipeline
from tiny_vlm import TINY_VLM

from roll_lite.model.vision import encode_conversation
from roll_lite.model.vision_run import run_processor, vision_token_ids

REPO = Path(__file__).resolve().parents[1]
COLORS = {"red": (255, 0, 0), "green": (0, 200, 0), "blue": (0, 0, 255)}


def messages(*parts: str) -> list[dict]:
    content = [{"type": "image"} if part == "<image>" else {"type": "text", "text": part} for part in parts]
    return [{"role": "user", "content": content}]


# (prompt messages, image files, answer, a wrong answer): one and two images of different sizes
ROWS = [
    (messages("<image>", "color?"), ["red.png"], "red", "blue"),
    (messages("which ", "<image>", " or ", "<image>", "?"), ["green.png", "blue.png"], "blue", "green"),
    (messages("<image>", "color?"), ["blue.png"], "blue", "red"),
    (messages("<image>", "<image>", "same?"), ["red.png", "green.png"], "no", "yes"),
]
MODEL = [*TINY_VLM, "model.pretrained_path=null"]
COMMON = [*MODEL, "workers.backend=local", "workers.torch_threads=1", "data.image_key=images", "save_model=false"]
SFT = ["sft.response_key=answer", "sft.batch_size=2", "sft.lr=1e-2", "sft.eval_every=100"]
RUNS = {
    "sft": ["--config", "configs/sft.yaml", "pipeline=test_vision_supervised:RecordingSFT", *SFT, "sft.steps=2"],
    "dpo": [
        "--config",
        "configs/dpo.yaml",
        "pipeline=test_vision_supervised:RecordingDPO",
        "preference.steps=2",
        "preference.batch_size=2",
        "preference.eval_every=100",
        "preference.reference=worker",
    ],
    "warm_start": [
        "--config",
        "configs/grpo.yaml",
        "pipeline=test_vision_supervised:RecordingWarmStart",
        *SFT,
        "sft.steps=2",
        "sft.eval_files=null",
        "data.eval_files=[]",
        "data.max_prompt_length=100",
        "rollout.prompts_per_step=2",
        "rollout.num_samples=2",
        "rollout.max_new_tokens=4",
        "reward.functions={token_accuracy: 1.0}",
        "steps=1",
        "eval_every=100",
    ],
}
BATCHES: dict[str, list] = {}  # run name -> the batches its actor trained on (the warm start's alone for GRPO)
WARM_START: dict[str, dict] = {}  # the warm start's last metrics


def record(actor, name: str):
    """The actor's train_step, recording each batch under `name`; returns the original."""
    train_step = actor.train_step

    def recorded(batch, loss):
        BATCHES.setdefault(name, []).append(batch)
        return train_step(batch, loss)

    actor.train_step = recorded
    return train_step


class RecordingSFT(SFTPipeline):
    def start_workers(self):
        super().start_workers()
        record(self.actor, "sft")


class RecordingDPO(DPOPipeline):
    def start_workers(self):
        super().start_workers()
        record(self.actor, "dpo")


class RecordingWarmStart(PPOPipeline):
    def warm_start(self):
        original = record(self.actor, "warm_start")
        WARM_START.update(super().warm_start())
        self.actor.train_step = original
        return WARM_START


def write_rows(folder: Path, rows: list[dict], name: str) -> Path:
    (folder / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder / name


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vision_supervised")
    for (name, rgb), size in zip(COLORS.items(), [(16, 16), (24, 8), (16, 32)]):
        Image.new("RGB", size, rgb).save(folder / f"{name}.png")
    write_rows(folder, [{"prompt": m, "images": f, "answer": a} for m, f, a, _ in ROWS], "sft.jsonl")
    pairs = [{"prompt": m, "images": f, "chosen": a, "rejected": b} for m, f, a, b in ROWS]
    write_rows(folder, pairs, "pairs.jsonl")
    return folder


@pytest.fixture(scope="module")
def runs(data):
    from roll_lite.cli import main

    files = {
        "sft": [f"sft.train_files={data / 'sft.jsonl'}", f"sft.eval_files={data / 'sft.jsonl'}"],
        "dpo": [f"preference.train_files={data / 'pairs.jsonl'}", f"preference.eval_files={data / 'pairs.jsonl'}"],
        "warm_start": [f"sft.train_files={data / 'sft.jsonl'}", f"data.train_files={data / 'sft.jsonl'}"],
    }
    for name, argv in RUNS.items():
        argv = [argv[0], str(REPO / argv[1]), *argv[2:], *COMMON, *files[name]]
        assert main([*argv, f"output_dir={data / 'out'}", f"run_name={name}"]) == 0, name
    return data


def history(folder: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (folder / "out" / name / "metrics.jsonl").read_text().splitlines()]


def fresh_prompts(folder: Path) -> list[tuple[list[int], dict, str]]:
    """Per row: its prompt's ids and image inputs from a fresh processor call (as the RL prompts'), its answer."""
    processor = run_processor()
    images = {name: Image.open(folder / f"{name}.png").convert("RGB") for name in COLORS}
    encoded = [
        encode_conversation(processor, m, [images[f.removesuffix(".png")] for f in files]) for m, files, *_ in ROWS
    ]
    return [(e["input_ids"].tolist(), e, a) for e, (_, _, a, _) in zip(encoded, ROWS)]


def check_rows(batch, folder: Path, masks: tuple[str, ...]) -> list[int]:
    """Every row of the batch is a row of ROWS: its ids up to its first target are a fresh processor call's on
    the prompt, with that call's image inputs; its targets are no vision token. Returns each row's ROWS index."""
    processor = run_processor()
    vision = torch.tensor(vision_token_ids(processor.tokenizer))
    fresh, found = fresh_prompts(folder), []
    targets = sum(batch[key] for key in masks).bool()
    for row in range(len(batch)):
        first = int(targets[row].nonzero()[0])
        ids = batch["input_ids"][row, :first].tolist()
        (index,) = [i for i, (prompt, _, _) in enumerate(fresh) if prompt == ids]
        entry = batch.non_tensor_batch["image_inputs"][row]
        for key in ("pixel_values", "image_grid_thw"):
            assert torch.equal(entry[key], fresh[index][1][key])
        held = int((batch["input_ids"][row] == processor.image_token_id).sum())
        assert held == int(entry["image_grid_thw"].prod(-1).sum()) // 4 > 0  # merge 2 × 2: each image once
        assert not torch.isin(batch["input_ids"][row][targets[row]], vision).any()
        found.append(index)
    return found


def test_sft_on_image_rows_trains_on_the_processors_ids_and_the_answers(runs):
    records = history(runs, "sft")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert math.isfinite(records[0]["eval/sft_loss"]) and math.isfinite(records[2]["eval/sft_loss"])
    for r in records[1:]:
        assert math.isfinite(r["sft/loss"]) and r["sft/grad_norm"] > 0, r
    tokenizer = run_processor().tokenizer
    assert len(BATCHES["sft"]) == 2
    for batch in BATCHES["sft"]:
        for row, index in enumerate(check_rows(batch, runs, ("response_mask",))):
            answer = batch["input_ids"][row][batch["response_mask"][row].bool()].tolist()
            assert tokenizer.decode(answer) == ROWS[index][2] + "<eos>\n"


def test_dpo_on_image_rows_pairs_share_their_images_and_the_reference_sees_them(runs):
    records = history(runs, "dpo")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[0]["eval/dpo/rewards/margins"] == 0  # the reference's log-probs on the same images: the policy's
    assert records[2]["eval/dpo/rewards/margins"] != 0
    for r in records[1:]:
        assert math.isfinite(r["dpo/loss"]) and r["dpo/grad_norm"] > 0, r
    tokenizer = run_processor().tokenizer
    for batch in BATCHES["dpo"]:
        indices = check_rows(batch, runs, ("chosen_mask", "rejected_mask"))
        assert indices[0::2] == indices[1::2]  # chosen, then rejected, of the same prompt
        entries = batch.non_tensor_batch["image_inputs"]
        for row in range(0, len(batch), 2):
            assert all(torch.equal(entries[row][k], entries[row + 1][k]) for k in entries[row])
            for side, mask, answer in ((row, "chosen_mask", 2), (row + 1, "rejected_mask", 3)):
                tokens = batch["input_ids"][side][batch[mask][side].bool()].tolist()
                assert tokenizer.decode(tokens) == ROWS[indices[row]][answer] + "<eos>\n"
        assert torch.isfinite(batch["reference_logps"]).all()


def test_the_sft_warm_start_before_grpo_trains_on_image_rows(runs):
    assert math.isfinite(WARM_START["sft/loss"]) and WARM_START["sft/grad_norm"] > 0
    assert len(BATCHES["warm_start"]) == 2
    for batch in BATCHES["warm_start"]:
        check_rows(batch, runs, ("response_mask",))
    (step,) = [r for r in history(runs, "warm_start") if r["step"] == 1]
    assert math.isfinite(step["actor/pg_loss"]) and step["actor/rollout_logp_gap_max"] < 1e-5


BAD = {  # a bad image row of each kind: (file name, its rows, the run's argv, the data error)
    "missing image": (
        "sft_missing.jsonl",
        [{"prompt": messages("<image>", "<image>"), "images": ["red.png", "gone.png"], "answer": "x"}],
        RUNS["sft"][:2] + SFT + ["sft.train_files={file}", "sft.eval_files=null"],
        "sft.train_files: {file}: row 0 (line 1): key 'images': image 1: no such image file '{folder}/gone.png'",
    ),
    "corrupt image": (
        "pairs_corrupt.jsonl",
        [{"prompt": messages("<image>"), "images": ["bad.png"], "chosen": "a", "rejected": "b"}],
        RUNS["dpo"][:2] + ["preference.train_files={file}", "preference.eval_files=null"],
        "preference.train_files: {file}: row 0 (line 1): key 'images': image 0: the image file '{folder}/bad.png' "
        "cannot be read as an image",
    ),
    "image in an answer": (
        "sft_assistant.jsonl",
        [
            {
                "prompt": messages("<image>") + [{"role": "assistant", "content": [{"type": "image"}]}],
                "images": [
                    "red.png",
                    "red.png",
                ],
            }
        ],
        RUNS["sft"][:2] + SFT + ["sft.response_key=null", "sft.train_files={file}", "sft.eval_files=null"],
        "sft.train_files: {file}: row 0 (line 1): key 'prompt': message 1 (assistant) holds an image",
    ),
    "parts and images differ": (
        "pairs_count.jsonl",
        [{"prompt": messages("<image>"), "images": ["red.png", "red.png"], "chosen": "a", "rejected": "b"}],
        RUNS["dpo"][:2] + ["preference.train_files={file}", "preference.eval_files=null"],
        "preference.train_files: {file}: row 0 (line 1): key 'prompt': the messages hold 1 image part(s)",
    ),
}


@pytest.mark.parametrize("kind", BAD)
def test_a_bad_image_row_is_a_data_error_naming_key_file_row_and_image(kind, data, capsys):
    from roll_lite.cli import main

    name, rows, argv, message = BAD[kind]
    (data / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    file = write_rows(data, rows, name)
    argv = [argv[0], str(REPO / argv[1]), *(a.format(file=file) for a in argv[2:]), *COMMON]
    assert main([*argv, f"output_dir={data / 'bad_out'}"]) == 2
    assert f"roll-train: data error: {message.format(file=file, folder=data)}" in capsys.readouterr().err
    assert not (data / "bad_out").exists()


def test_image_rows_with_a_text_model_are_a_config_error(data, capsys):
    """(The reward-model pipeline on a vision-language model stays refused: tests/test_vision_run.py.)"""
    from roll_lite.cli import main

    sft = [RUNS["sft"][0], str(REPO / RUNS["sft"][1]), *SFT, f"sft.train_files={data / 'sft.jsonl'}"]
    text = [a for a in COMMON if not a.startswith("model.model_type")]
    assert main([*sft, *text, "sft.eval_files=null", f"output_dir={data / 'bad_out'}"]) == 2
    assert "roll-train: config error: data.image_key: the model reads no images" in capsys.readouterr().err
    assert not (data / "bad_out").exists()
