"""The visual task's data and config (docs/vision.md, "A visual task that learns"): the generator repeats by
seed, the shipped files are its output, no held-out image is a training image, every image decodes to the
32 × 32 picture the processor turns into 16 image tokens, configs/count_shapes.yaml loads and validates, and
the docs give its command."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow.parquet as pq
from PIL import Image

from roll_lite.config.loading import load_config
from roll_lite.data.count_shapes import count_shapes_rows

REPO = Path(__file__).resolve().parents[1]
COMMAND = "roll-train --config configs/count_shapes.yaml"


def test_the_generator_repeats_by_seed_and_holds_out_its_eval_images():
    train, held_out = count_shapes_rows(num_train=40, num_eval=8, seed=3)
    assert (train, held_out) == count_shapes_rows(num_train=40, num_eval=8, seed=3)
    assert held_out != count_shapes_rows(num_train=40, num_eval=8, seed=4)[1]
    assert [row["answer"] for row in held_out] == list("12341234")
    assert not {row["images"][0] for row in held_out} & {row["images"][0] for row in train}


def test_the_shipped_files_are_the_generators_and_their_images_decode():
    train = pq.read_table(REPO / "data/count_shapes/train.parquet").to_pylist()
    held_out = pq.read_table(REPO / "data/count_shapes/eval.parquet").to_pylist()
    assert (train, held_out) == count_shapes_rows()
    assert len(train) == 2000 and len(held_out) == 64
    assert len({row["images"][0] for row in held_out}) == 64
    assert not {row["images"][0] for row in held_out} & {row["images"][0] for row in train}
    for row in held_out:
        with Image.open(io.BytesIO(row["images"][0])) as image:
            assert image.size == (32, 32) and image.mode == "RGB"


def test_the_config_loads_and_the_docs_give_its_command():
    config = load_config(REPO / "configs/count_shapes.yaml")
    assert config.model.model_type == "qwen2_5_vl" and config.data.image_key == "images"
    assert config.rollout.max_new_tokens == 1 and config.sft.steps == 0
    assert f"\n{COMMAND}\n" in (REPO / "docs/vision.md").read_text()
    assert f"#   {COMMAND}\n" in (REPO / "configs/count_shapes.yaml").read_text()
