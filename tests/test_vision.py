"""Images in data rows (roll_lite/data/images.py) and the tiny Qwen2.5-VL with its local processor
(roll_lite/model/vision.py): decoding and errors, one expansion per placeholder, a frozen vision
tower, M-RoPE position ids that restart per packed sequence."""

from __future__ import annotations

import io
import json
import re

import pytest
import torch
from PIL import Image

from roll_lite.data.files import DataError, read_table
from roll_lite.data.images import check_image_parts, content_problem, row_images
from roll_lite.model.vision import (
    IMAGE_PAD,
    build_vision_model,
    build_vision_processor,
    encode_conversation,
    mrope_position_ids,
    tiny_vision_config,
    vision_tower,
)
from roll_lite.rollout.images import check_expanded_once, image_token_count

MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "color?"}]}]


def png(color, size=(12, 9)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, "PNG")
    return buffer.getvalue()


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_paths_relative_to_the_data_file_and_the_errors_that_name_file_row_and_key(tmp_path):
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "red.png").write_bytes(png((255, 0, 0)))
    (tmp_path / "pics" / "bad.png").write_bytes(png((0, 0, 255))[:40])  # truncated
    rows = [
        {"prompt": "a", "images": ["pics/red.png"]},
        {"prompt": "b", "images": ["pics/gone.png"]},
        {"prompt": "c", "images": ["pics/bad.png"]},
        {"prompt": "d", "images": []},
    ]
    table = read_table(write_jsonl(tmp_path / "train.jsonl", rows), "data.train_files")
    (image,) = row_images(table, 0, "images")
    assert image.mode == "RGB" and image.size == (12, 9) and image.getpixel((0, 0)) == (255, 0, 0)
    with pytest.raises(
        DataError, match=r"train.jsonl: row 1 \(line 2\): key 'images': image 0: no such image file .*gone"
    ):
        row_images(table, 1, "images")
    with pytest.raises(DataError, match=r"row 2 .*key 'images': image 0: the image file .*bad.png.* cannot be read"):
        row_images(table, 2, "images")
    with pytest.raises(DataError, match=r"row 3 .*empty list of images"):
        row_images(table, 3, "images")
    with pytest.raises(DataError, match=r"row 0 .*key 'picture' \(data.image_key\) is missing; the file's columns"):
        row_images(table, 0, "picture")


def test_bytes_in_saved_and_parquet_datasets(tmp_path):
    import datasets

    features = datasets.Features({"prompt": datasets.Value("string"), "images": datasets.List(datasets.Image())})
    table = datasets.Dataset.from_dict(
        {
            "prompt": ["two", "corrupt"],
            "images": [
                [{"bytes": png((0, 255, 0)), "path": None}, {"bytes": png((0, 0, 9), (5, 7)), "path": None}],
                [{"bytes": b"not a png", "path": None}],
            ],
        },
        features=features,
    )
    table.save_to_disk(str(tmp_path / "saved"))
    table.to_parquet(str(tmp_path / "rows.parquet"))
    for path in (tmp_path / "saved", tmp_path / "rows.parquet"):
        read = read_table(path, "data.train_files")
        first, second = row_images(read, 0, "images")
        assert first.getpixel((3, 3)) == (0, 255, 0) and second.size == (5, 7)
        with pytest.raises(DataError, match=rf"{path.name}: row 1: key 'images': image 0: its 9 bytes cannot be read"):
            row_images(read, 1, "images")


def test_message_parts_and_their_count(tmp_path):
    table = read_table(write_jsonl(tmp_path / "t.jsonl", [{"prompt": "x", "images": ["a.png", "b.png"]}]), "k")
    assert content_problem(MESSAGES[0]["content"]) is None
    assert "content part 0" in content_problem([{"type": "audio"}])
    check_image_parts(table, 0, "prompt", MESSAGES * 2, 2)
    with pytest.raises(DataError, match=r"row 0 .*key 'prompt': the messages hold 1 image part\(s\) .* row has 2"):
        check_image_parts(table, 0, "prompt", MESSAGES, 2)


@pytest.fixture(scope="module")
def vision():
    processor = build_vision_processor(patch_size=4, merge_size=2, min_pixels=64, max_pixels=256)
    model = build_vision_model(tiny_vision_config(processor), dtype=torch.float64, seed=0, freeze_vision=True)
    return processor, model


def test_each_placeholder_expanded_once(vision):
    processor, _ = vision
    images = [Image.new("RGB", (12, 9), (200, 10, 10)), Image.new("RGB", (30, 8), (1, 2, 3))]
    encoded = encode_conversation(processor, MESSAGES * 2, images)
    pads = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    per_image = image_token_count(encoded["image_grid_thw"], merge_size=2)
    assert int((encoded["input_ids"] == pads).sum()) == sum(per_image) and per_image[0] >= 1
    assert len(encoded["pixel_values"]) == int(encoded["image_grid_thw"].prod(dim=-1).sum())
    again = encode_conversation(build_vision_processor(4, 2, 64, 256), MESSAGES * 2, images)  # a fresh processor
    assert torch.equal(again["input_ids"], encoded["input_ids"])
    check_expanded_once(encoded["input_ids"], encoded["image_grid_thw"], pads, merge_size=2)
    # What must never happen: ids that already hold the expansion expanded a second time, or not at all.
    grid = encoded["image_grid_thw"]
    twice = torch.cat([encoded["input_ids"], torch.full((sum(per_image),), pads)])
    for ids, grids in ((twice, grid), (encoded["input_ids"], None), (encoded["input_ids"], grid[:1])):
        with pytest.raises(ValueError, match="must be expanded exactly once"):
            check_expanded_once(ids, grids, pads, merge_size=2)


def test_frozen_vision_tower_and_mrope_restarting_per_packed_sequence(vision):
    processor, model = vision
    image = Image.new("RGB", (16, 16), (90, 20, 200))
    encoded = encode_conversation(processor, MESSAGES, [image])
    out = model(
        input_ids=encoded["input_ids"][None],
        pixel_values=encoded["pixel_values"].double(),
        image_grid_thw=encoded["image_grid_thw"],
    )
    assert out.logits.dtype == torch.float64
    out.logits.sum().backward()
    assert all(p.grad is None for p in vision_tower(model).parameters())
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0
    model.zero_grad()

    text = processor.tokenizer("U: hi\nA: ", return_tensors="pt")["input_ids"][0]
    ids = encoded["input_ids"]
    packed = mrope_position_ids(model, [ids, text, ids], [encoded["image_grid_thw"], None, encoded["image_grid_thw"]])
    assert packed.shape == (3, 2 * len(ids) + len(text))
    alone = mrope_position_ids(model, [ids], [encoded["image_grid_thw"]])
    starts = [0, len(ids), len(ids) + len(text)]
    for start in starts:
        assert packed[:, start].tolist() == [0, 0, 0]  # restart in all three rows
    assert torch.equal(packed[:, starts[2] :], alone)
    assert torch.equal(packed[:, starts[1] : starts[2]], torch.arange(len(text)).expand(3, -1))
    image_rows = packed[:, : len(ids)][:, ids == model.config.image_token_id]
    assert not torch.equal(image_rows[1], image_rows[2])  # height and width differ inside the image


def test_packed_rows_with_images_equal_each_alone(vision):
    """Two conversations packed in one row (varlen attention, M-RoPE restarting per sequence) give
    the logits of each alone, in float64, exactly; and our position ids are the model's own ones."""
    from roll_lite.model.attention import register_attention

    processor, model = vision
    model.set_attn_implementation(register_attention())
    first = encode_conversation(processor, MESSAGES, [Image.new("RGB", (16, 16), (90, 20, 200))])
    second = encode_conversation(processor, MESSAGES, [Image.new("RGB", (24, 8), (9, 200, 2))])
    image_token = model.config.image_token_id

    def forward(encoded_rows, **packed):
        ids = torch.cat([e["input_ids"] for e in encoded_rows])
        grids = torch.cat([e["image_grid_thw"] for e in encoded_rows])
        positions = mrope_position_ids(model, [e["input_ids"] for e in encoded_rows], list(grids.split(1)))
        pixels = torch.cat([e["pixel_values"] for e in encoded_rows]).double()
        kwargs = dict(input_ids=ids[None], pixel_values=pixels, image_grid_thw=grids)
        logits = model(**kwargs, position_ids=positions[:, None], **packed).logits[0]
        return logits, kwargs

    alone = []
    for encoded in (first, second):
        logits, kwargs = forward([encoded])
        # transformers computes the same M-RoPE ids itself, but only given mm_token_type_ids: without them
        # it silently falls back to 1-D positions (transformers 5.19), so roll_lite always passes its own.
        own = model(**kwargs, mm_token_type_ids=(kwargs["input_ids"] == image_token).int()).logits[0]
        assert torch.equal(logits, own) and not torch.equal(logits, model(**kwargs).logits[0])
        alone.append(logits)
    lengths = [len(first["input_ids"]), len(second["input_ids"])]
    cu_seqlens = torch.tensor([0, lengths[0], sum(lengths)], dtype=torch.int32)
    packed, _ = forward(
        [first, second],
        cu_seq_lens_q=cu_seqlens,
        cu_seq_lens_k=cu_seqlens,
        max_length_q=max(lengths),
        max_length_k=max(lengths),
    )
    assert torch.equal(packed, torch.cat(alone))


def test_hf_engine_ids_are_the_trained_ids_and_its_log_probs_the_trainers(vision):
    """The hf engine takes the processor's ids as they are (each placeholder expanded once, by the
    processor): prompt + response is what the trainer forwards, with the sample's pixel_values and
    image_grid_thw and M-RoPE positions computed per sequence, and the trainer's log-probs are the
    engine's (recorded in float32)."""
    from roll_lite.rollout.engine import SamplingParams
    from roll_lite.rollout.hf import HFEngine

    processor, model = vision
    tokenizer = processor.tokenizer
    conversations = [
        (MESSAGES, [Image.new("RGB", (16, 16), (90, 20, 200))]),
        (MESSAGES * 2, [Image.new("RGB", (24, 8), (9, 200, 2)), Image.new("RGB", (8, 8), (9, 2, 2))]),
    ]
    encoded = [encode_conversation(processor, messages, images) for messages, images in conversations]
    engine = HFEngine(model, tokenizer.pad_token_id, tokenizer.eos_token_id, seed=3)
    images = [{key: e[key] for key in ("pixel_values", "image_grid_thw")} for e in encoded]
    completions = engine.generate(
        [e["input_ids"].tolist() for e in encoded], SamplingParams(max_new_tokens=5, num_samples=2), images=images
    )
    fresh = build_vision_processor(4, 2, 64, 256)
    image_token = model.config.image_token_id
    for row, (response, engine_log_probs) in enumerate(zip(completions.token_ids, completions.log_probs)):
        sample, (messages, pictures) = encoded[row // 2], conversations[row // 2]
        prompt = encode_conversation(fresh, messages, pictures)["input_ids"]
        assert torch.equal(prompt, sample["input_ids"])  # the engine's prompt ids: a fresh processor call's
        ids = torch.cat([prompt, torch.tensor(response)])  # the ids the trainer forwards
        check_expanded_once(ids, sample["image_grid_thw"], image_token, merge_size=2)
        positions = mrope_position_ids(model, [ids], [sample["image_grid_thw"]])
        with torch.no_grad():
            logits = model(
                input_ids=ids[None],
                pixel_values=sample["pixel_values"],
                image_grid_thw=sample["image_grid_thw"],
                position_ids=positions[:, None],
            ).logits[0, len(prompt) - 1 : -1]
        trainer = torch.log_softmax(logits.float(), dim=-1).gather(1, torch.tensor(response)[:, None])[:, 0]
        torch.testing.assert_close(trainer, torch.tensor(engine_log_probs), rtol=0, atol=1e-5)
    twice = encoded[0]["input_ids"].tolist() + [image_token] * 4  # the image's 4 tokens a second time
    with pytest.raises(ValueError, match="expanded exactly once"):
        engine.generate([twice], SamplingParams(max_new_tokens=2), images=images[:1])


def test_the_policy_head_with_images_padded_and_packed_equals_the_full_model(vision):
    """VisionLMWithLogProbs on two conversations with images, padded (two rows) and packed (one row),
    gives the full model's next-token log-probs of each alone, in float64 (to 1e-12: the chunked head
    and a full log_softmax round apart); the frozen vision tower
    gets no gradient, the LM does."""
    from roll_lite.model.attention import register_attention
    from roll_lite.model.vision import VisionLMWithLogProbs

    processor, model = vision
    model.set_attn_implementation(register_attention())
    head = VisionLMWithLogProbs(model, chunk_size=7)
    rows = [
        encode_conversation(processor, MESSAGES, [Image.new("RGB", (16, 16), (90, 20, 200))]),
        encode_conversation(processor, MESSAGES * 2, [Image.new("RGB", (24, 8), (9, 200, 2))] * 2),
    ]
    ids = [row["input_ids"] for row in rows]
    grids = [row["image_grid_thw"] for row in rows]
    pixels = torch.cat([row["pixel_values"] for row in rows])
    expected = []
    for row, positions in zip(rows, (mrope_position_ids(model, [i], [g]) for i, g in zip(ids, grids))):
        with torch.no_grad():
            logits = model(
                input_ids=row["input_ids"][None],
                pixel_values=row["pixel_values"],
                image_grid_thw=row["image_grid_thw"],
                position_ids=positions[:, None],
            ).logits[0]
        expected.append(torch.log_softmax(logits[:-1], -1).gather(1, row["input_ids"][1:, None])[:, 0])

    lengths = [len(i) for i in ids]
    cu_seqlens = torch.tensor([0, lengths[0], sum(lengths)], dtype=torch.int32)
    packed = head(
        torch.cat(ids)[None],
        mrope_position_ids(model, ids, grids)[:, None],
        cu_seqlens=cu_seqlens,
        max_seqlen=max(lengths),
        pixel_values=pixels,
        image_grid_thw=torch.cat(grids),
    )["log_probs"][0]
    for seq, (start, length) in enumerate(zip(cu_seqlens[:-1].tolist(), lengths)):
        torch.testing.assert_close(packed[start : start + length - 1], expected[seq], rtol=0, atol=1e-12)

    width = max(lengths)
    padded_ids = torch.full((2, width), processor.tokenizer.pad_token_id)
    mask = torch.zeros_like(padded_ids)
    positions = torch.zeros(3, 2, width, dtype=torch.long)
    for r, (i, g) in enumerate(zip(ids, grids)):
        padded_ids[r, : len(i)], mask[r, : len(i)] = i, 1
        positions[:, r, : len(i)] = mrope_position_ids(model, [i], [g])
    padded = head(padded_ids, positions, attention_mask=mask, pixel_values=pixels, image_grid_thw=torch.cat(grids))
    for r, length in enumerate(lengths):
        torch.testing.assert_close(padded["log_probs"][r, : length - 1], expected[r], rtol=0, atol=1e-12)

    padded["log_probs"][0, : lengths[0] - 1].sum().backward()
    assert all(p.grad is None for p in vision_tower(model).parameters())
    assert model.lm_head.weight.grad.abs().sum() > 0
    model.zero_grad()


def test_min_and_max_pixels_bound_each_images_tokens():
    processor = build_vision_processor(patch_size=4, merge_size=2, min_pixels=64, max_pixels=256)
    large = encode_conversation(processor, MESSAGES, [Image.new("RGB", (100, 60), (1, 1, 1))])
    small = encode_conversation(processor, MESSAGES, [Image.new("RGB", (3, 2), (1, 1, 1))])
    for encoded in (large, small):
        _, h, w = encoded["image_grid_thw"][0].tolist()
        assert 64 <= h * w * 4 * 4 <= 256 and h % 2 == 0 and w % 2 == 0  # patches of 4 px, merged 2 × 2
    assert large["image_grid_thw"][0].tolist() == [1, 2, 4]  # 100 × 60 keeps its aspect within 256 px
    with pytest.raises(ValueError, match="min_pixels 512 is over max_pixels 256"):
        build_vision_processor(min_pixels=512, max_pixels=256)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.min_pixels=64"], "data.min_pixels: bounds the images of data.image_key, which is not set"),
        (["data.image_key=im", "data.max_pixels=0"], "data.max_pixels: must be >= 1 (pixels), got 0"),
        (["data.image_key=im", "data.min_pixels=512", "data.max_pixels=256"], "data.min_pixels: 512 is over"),
        (["model.freeze_vision=true"], "model.freeze_vision: needs a vision-language model"),
    ],
)
def test_image_keys_are_checked_naming_the_key(overrides, message):
    from roll_lite.config import ConfigError, load_config

    load_config(None, ["data.image_key=im", "data.min_pixels=64", "data.max_pixels=256"])
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, overrides)


def test_image_rows_are_read_before_ray_starts_then_refused(tmp_path, monkeypatch, capsys):
    """roll-train with data.image_key and a text model: every image decoded and every row's image parts
    counted in the driver (a bad row is a data error naming file, row and key); good rows then stop with a
    config error, as the model reads no images. Nothing is written, Ray never starts."""
    import sys

    from roll_lite.cli import main

    (tmp_path / "red.png").write_bytes(png((255, 0, 0)))
    good = {"prompt": MESSAGES, "answer": "red", "im": "red.png"}
    write_jsonl(tmp_path / "train.jsonl", [good, good])
    write_jsonl(tmp_path / "text.jsonl", [good, {"prompt": "color?", "answer": "red", "im": "red.png"}])
    monkeypatch.chdir(tmp_path)
    run = ["steps=1", f"output_dir={tmp_path / 'out'}", "data.image_key=im"]
    assert main([*run, "data.train_files=train.jsonl"]) == 2
    assert capsys.readouterr().err.strip() == (
        "roll-train: config error: data.image_key: the rows and their images are good, but the model reads no "
        "images: set model.model_type=qwen2_5_vl or qwen3_vl (a vision-language model built from the model keys; docs/vision.md)"
    )
    assert main([*run, "data.train_files=train.jsonl", "data.eval_files=text.jsonl"]) == 2
    assert capsys.readouterr().err.strip() == (
        "roll-train: data error: data.eval_files: text.jsonl: row 1 (line 2): key 'prompt': a row with images needs "
        "its prompt as chat messages, with one {'type': 'image'} content part per image"
    )
    assert not (tmp_path / "out").exists()
    assert "ray" not in sys.modules or not __import__("ray").is_initialized()
