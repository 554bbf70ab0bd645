"""The code task's data: write a one-line Python function from three examples, scored on hidden cases
in the sandbox (reward.code). A prompt shows f at 0, 10 and 100; the response is a program such as
`f=lambda x:3*x+7`, run against f's values at eight inputs the prompt does not show.

    f(0)=7,f(10)=37,f(100)=307:   ->   f=lambda x:3*x+7
    f(0)=4,f(10)=104,f(100)=10004:   ->   f=lambda x:x*x+4

f is a*x+b (a in 1..9) or x*x+b, with b in 0..9: 100 functions. The examples at 0, 10 and 100 show
a and b as digits, so a 1 M-parameter model can learn to read them off; held-out prompts are
functions that no training row shows, so passing them needs the reading, not memory. Training rows
carry a noisy demonstrator's program (`demonstration`) for the SFT warm start: right with probability
0.35, otherwise the simpler x+b with the right b (right only when a is 1), which gives a sharp policy
with a low pass rate that RL can raise (PLATFORM.md: why a noisy demonstrator).

    python -m roll_lite.data.integer_functions data/integer_functions

writes the shipped files byte for byte.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import cast

SLOPES, OFFSETS, SQUARE = range(1, 10), range(0, 10), "x*x"
SHOWN_INPUTS = (0, 10, 100)
HIDDEN_INPUTS = (-7, -3, 3, 4, 6, 9, 12, 25)
NUM_TRAIN, NUM_EVAL, SEED = 4000, 24, 0
CORRECT_FRACTION = 0.35


def functions() -> list[tuple[int | str, int]]:
    """Every (slope, offset): a*x+b for a in SLOPES, and x*x+b (slope SQUARE)."""
    return [(a, b) for a in [*SLOPES, SQUARE] for b in OFFSETS]


def value(slope: int | str, b: int, x: int) -> int:
    return (x * x if slope == SQUARE else cast(int, slope) * x) + b  # cast: SQUARE is the only str slope


def program(slope: int | str, b: int) -> str:
    """The canonical one-line program: f=lambda x:x+4, f=lambda x:3*x+7, f=lambda x:x*x+0."""
    term = "x" if slope == 1 else SQUARE if slope == SQUARE else f"{slope}*x"
    return f"f=lambda x:{term}+{b}"


def make_row(slope: int | str, b: int) -> dict:
    prompt = ",".join(f"f({x})={value(slope, b, x)}" for x in SHOWN_INPUTS) + ":"
    tests = {"function": "f", "cases": [{"args": [x], "expected": value(slope, b, x)} for x in HIDDEN_INPUTS]}
    return {"prompt": prompt, "answer": program(slope, b), "tests": tests}


def integer_function_rows(
    num_train: int = NUM_TRAIN, num_eval: int = NUM_EVAL, seed: int = SEED
) -> tuple[list[dict], list[dict]]:
    """(train rows, eval rows): eval functions are distinct and no training row shows one."""
    every = functions()
    if not 0 < num_eval < len(every):
        raise ValueError(f"integer_function_rows: num_eval must be in 1..{len(every) - 1}, got {num_eval}")
    held_out = random.Random(f"eval-{seed}").sample(every, num_eval)
    seen = [function for function in every if function not in set(held_out)]
    train_rng, demonstrator = random.Random(f"train-{seed}"), random.Random(f"demonstration-{seed}")
    train_rows = []
    for _ in range(num_train):
        slope, b = train_rng.choice(seen)
        row = make_row(slope, b)
        row["demonstration"] = row["answer"] if demonstrator.random() < CORRECT_FRACTION else program(1, b)
        train_rows.append(row)
    return train_rows, [make_row(slope, b) for slope, b in held_out]


def write_integer_functions(out_dir: str | Path, **options) -> tuple[Path, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train_rows, eval_rows = integer_function_rows(**options)
    for rows, name in ((train_rows, "train.jsonl"), (eval_rows, "eval.jsonl")):
        (out_dir / name).write_text(
            "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows), encoding="utf-8"
        )
    return out_dir / "train.jsonl", out_dir / "eval.jsonl"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Write the code task's train.jsonl and eval.jsonl.")
    parser.add_argument("out_dir")
    parser.add_argument("--num-train", type=int, default=NUM_TRAIN)
    parser.add_argument("--num-eval", type=int, default=NUM_EVAL)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    print(
        "wrote",
        *write_integer_functions(args.out_dir, num_train=args.num_train, num_eval=args.num_eval, seed=args.seed),
    )


if __name__ == "__main__":
    main()
