"""The visual task's data: count the shapes (1 to 4) in a small image, answer one digit (docs/vision.md, "A
visual task that learns"). Drawn with Pillow, nothing downloaded. The files configs/count_shapes.yaml reads
(data/count_shapes/{train,eval}.parquet: the prompt as chat messages, the image's PNG bytes, the answer) are
this module's output, shipped in the repository. Regenerate them with

    python -m roll_lite.data.count_shapes data/count_shapes

Each image is 32 × 32 pixels (16 image tokens with the tiny Qwen2.5-VL's processor): a dark background split
into four 16 × 16 cells, `count` of them holding a light square or disc at a random place, size and shade.
Held-out rows are drawn from another seed, one count in four each, and no training image equals one of them.

The picture of a run's answers in docs/vision.md (the first held-out images, each with the policy's greedy
answer at the run's last eval) is drawn from the run's eval samples with

    python -m roll_lite.data.count_shapes outputs/grpo_count_shapes --grid docs/images/count_shapes_answers.png
"""

from __future__ import annotations

import argparse
import io
import json
import random
from pathlib import Path

NUM_TRAIN, NUM_EVAL, SEED = 2000, 64, 0
SIZE, CELL, MAX_COUNT = 32, 16, 4
QUESTION = "how many shapes?"


def draw_image(count: int, rng: random.Random) -> bytes:
    """The PNG bytes of a SIZE × SIZE image with `count` shapes, one per cell of a 2 × 2 grid."""
    from PIL import Image, ImageDraw

    background = rng.randrange(0, 40)
    image = Image.new("RGB", (SIZE, SIZE), (background,) * 3)
    draw = ImageDraw.Draw(image)
    cells = rng.sample(range(MAX_COUNT), count)
    for cell in sorted(cells):
        side = rng.randint(7, 11)
        left = (cell % 2) * CELL + rng.randint(1, CELL - side - 1)
        top = (cell // 2) * CELL + rng.randint(1, CELL - side - 1)
        shade = tuple(rng.randint(180, 255) for _ in range(3))
        box = (left, top, left + side - 1, top + side - 1)
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=shade)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=False)
    return out.getvalue()


def make_row(count: int, rng: random.Random) -> dict:
    return {
        "prompt": [{"role": "user", "content": [{"type": "image", "text": None}, {"type": "text", "text": QUESTION}]}],
        "images": [draw_image(count, rng)],
        "answer": str(count),
    }


def count_shapes_rows(num_train: int = NUM_TRAIN, num_eval: int = NUM_EVAL, seed: int = SEED):
    """(train rows, eval rows): counts balanced in eval, uniform in train; no train image is an eval image."""
    eval_rng = random.Random(f"count-shapes-eval-{seed}")
    eval_rows = [make_row(1 + i % MAX_COUNT, eval_rng) for i in range(num_eval)]
    held_out = {row["images"][0] for row in eval_rows}
    train_rng = random.Random(f"count-shapes-train-{seed}")
    train_rows: list[dict] = []
    while len(train_rows) < num_train:
        row = make_row(train_rng.randint(1, MAX_COUNT), train_rng)
        if row["images"][0] not in held_out:
            train_rows.append(row)
    return train_rows, eval_rows


def write_parquet(rows: list[dict], path: Path) -> None:
    """The rows as a Parquet file whose image column is a list of PNG bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path, compression="zstd")


def write_count_shapes(out_dir: str | Path, **options) -> tuple[Path, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train_rows, eval_rows = count_shapes_rows(**options)
    write_parquet(train_rows, out_dir / "train.parquet")
    write_parquet(eval_rows, out_dir / "eval.parquet")
    return out_dir / "train.parquet", out_dir / "eval.parquet"


def answer_grid(run_dir: str | Path, out: str | Path, eval_file: str | Path, shown: int = 16, columns: int = 8) -> Path:
    """A PNG of the first `shown` held-out images, each above its answer and the policy's greedy answer at the
    run's last eval (<run_dir>/eval_samples/step_N.jsonl, in the eval file's row order)."""
    import pyarrow.parquet as pq
    from PIL import Image, ImageDraw

    samples_dir = Path(run_dir) / "eval_samples"
    last = max(samples_dir.glob("step_*.jsonl"), key=lambda p: int(p.stem.split("_")[1]), default=None)
    if last is None:
        raise SystemExit(f"count_shapes --grid: no eval samples in {samples_dir}")
    samples = [json.loads(line) for line in last.read_text().splitlines()][:shown]
    rows = pq.read_table(eval_file).to_pylist()[: len(samples)]
    scale, label = 3, 14
    side = SIZE * scale
    grid = Image.new("RGB", (columns * (side + 4), -(-len(rows) // columns) * (side + label + 4)), "white")
    draw = ImageDraw.Draw(grid)
    for i, (row, sample) in enumerate(zip(rows, samples)):
        if sample["answer"] != row["answer"]:
            raise SystemExit(f"count_shapes --grid: {last} row {i} is not {eval_file}'s row {i}")
        x, y = (i % columns) * (side + 4) + 2, (i // columns) * (side + label + 4) + 2
        grid.paste(Image.open(io.BytesIO(row["images"][0])).resize((side, side), Image.Resampling.NEAREST), (x, y))
        right = sample["response"].strip() == row["answer"]
        draw.text(
            (x + 2, y + side + 1),
            f"{row['answer']}: said {sample['response']!r}",
            fill=(0, 120, 0) if right else (200, 0, 0),
        )
    grid.save(out)
    return Path(out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Write the shape-counting train.parquet and eval.parquet.")
    parser.add_argument("out_dir", help="where the files go (with --grid: the run directory)")
    parser.add_argument("--num-train", type=int, default=NUM_TRAIN)
    parser.add_argument("--num-eval", type=int, default=NUM_EVAL)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--grid", metavar="PNG", help="draw the run's last eval answers into this PNG instead")
    parser.add_argument("--eval-file", default="data/count_shapes/eval.parquet", help="the run's data.eval_files")
    args = parser.parse_args(argv)
    if args.grid:
        print("wrote", answer_grid(args.out_dir, args.grid, args.eval_file))
        return
    print("wrote", *write_count_shapes(args.out_dir, num_train=args.num_train, num_eval=args.num_eval, seed=args.seed))


if __name__ == "__main__":
    main()
