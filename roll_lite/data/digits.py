"""The demo's data: reverse a string of digits ("38125=" -> "52183"), as JSONL files.

Verifiable, tiny, and hard enough for a 1 M-parameter model that RL has something to do. The files
the demo configs read (data/reverse_digits/{train,eval}.jsonl) are this module's output, shipped in
the repository. Training rows also carry a `demonstration`: the response of a noisy demonstrator
that the demo's SFT warm start imitates (sft.response_key: demonstration). Regenerate the files,
byte for byte, with

    python -m roll_lite.data.digits data/reverse_digits

Eval prompts are held out: no training row repeats one. Training rows are drawn with replacement,
so short prompts repeat (there are only 1000 three-digit strings).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

NUM_TRAIN, NUM_EVAL, MIN_DIGITS, MAX_DIGITS, SEED = 20000, 64, 3, 7, 0
CORRECT_FRACTION = 0.3  # the demonstrator's share of right answers


def make_row(digits: str) -> dict[str, str]:
    return {"prompt": f"{digits}=", "answer": digits[::-1]}


def _draw(rng: random.Random, min_digits: int, max_digits: int) -> dict[str, str]:
    length = rng.randint(min_digits, max_digits)
    return make_row("".join(rng.choice("0123456789") for _ in range(length)))


def reverse_digits_rows(
    num_train: int = NUM_TRAIN,
    num_eval: int = NUM_EVAL,
    min_digits: int = MIN_DIGITS,
    max_digits: int = MAX_DIGITS,
    seed: int = SEED,
) -> tuple[list[dict], list[dict]]:
    """(train rows, eval rows): eval prompts are distinct and never appear in train; train rows
    carry the noisy demonstrator's response ('demonstration')."""
    if not 1 <= min_digits <= max_digits:
        raise ValueError(f"reverse_digits_rows: need 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}")
    eval_rows: list[dict]
    train_rows: list[dict]
    eval_rng, eval_rows, held_out = random.Random(f"eval-{seed}"), [], set()
    while len(eval_rows) < num_eval:
        row = _draw(eval_rng, min_digits, max_digits)
        if row["prompt"] not in held_out:
            held_out.add(row["prompt"])
            eval_rows.append(row)
    train_rng, train_rows = random.Random(f"train-{seed}"), []
    while len(train_rows) < num_train:
        row = _draw(train_rng, min_digits, max_digits)
        if row["prompt"] not in held_out:
            train_rows.append(row)
    demonstrator = random.Random(f"demonstration-{seed}")
    for row in train_rows:
        row["demonstration"] = noisy_demonstration(row["prompt"], row["answer"], CORRECT_FRACTION, demonstrator)
    return train_rows, eval_rows


def write_jsonl(rows: list[dict], path: Path) -> None:
    path.write_text("".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows), encoding="utf-8")


def write_reverse_digits(out_dir: str | Path, **options) -> tuple[Path, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train_rows, eval_rows = reverse_digits_rows(**options)
    write_jsonl(train_rows, out_dir / "train.jsonl")
    write_jsonl(eval_rows, out_dir / "eval.jsonl")
    return out_dir / "train.jsonl", out_dir / "eval.jsonl"


def noisy_demonstration(prompt: str, answer: str, correct_fraction: float, rng: random.Random) -> str:
    """The demo's noisy demonstrator: the right answer with probability
    `correct_fraction`, otherwise a simpler wrong behaviour (copying the digits, i.e. the prompt
    without its trailing '='). It gives a sharp policy with low reward that RL can improve (see
    ../shared/PLATFORM.md: a pure-task SFT samples too broadly)."""
    if rng.random() < correct_fraction:
        return answer
    return prompt.rstrip("=")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Write the digit-reversal train.jsonl and eval.jsonl.")
    parser.add_argument("out_dir")
    parser.add_argument("--num-train", type=int, default=NUM_TRAIN)
    parser.add_argument("--num-eval", type=int, default=NUM_EVAL)
    parser.add_argument("--min-digits", type=int, default=MIN_DIGITS)
    parser.add_argument("--max-digits", type=int, default=MAX_DIGITS)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    paths = write_reverse_digits(
        args.out_dir,
        num_train=args.num_train,
        num_eval=args.num_eval,
        min_digits=args.min_digits,
        max_digits=args.max_digits,
        seed=args.seed,
    )
    print("wrote", *paths)


if __name__ == "__main__":
    main()
