"""Short arithmetic word problems with worked solutions that end in \\boxed{answer}.

One addition or subtraction of small numbers, told with a few names, objects and sentence
templates: small enough that a ~1 M-parameter model learns it in minutes on a CPU. Every row is
{"prompt": question, "answer": "8", "solution": "3 + 5 = 8. The answer is \\boxed{8}."}.
"""

from __future__ import annotations

import random

NAMES = ["Tom", "Ana", "Sam", "Lily", "Ben", "Mia", "Leo", "Zoe"]
OBJECTS = ["apples", "pens", "books", "coins", "shells", "cards", "stamps", "marbles"]
# (template, operation): {name}, {obj}, {a}, {b}. Subtraction templates take b away from a.
TEMPLATES = [
    ("{name} has {a} {obj}. {name} gets {b} more. How many {obj} does {name} have now?", "+"),
    ("{name} had {a} {obj} and found {b} more. How many {obj} does {name} have?", "+"),
    ("{name} has {a} {obj}. {name} gives away {b}. How many {obj} does {name} have left?", "-"),
    ("{name} had {a} {obj} and lost {b} of them. How many {obj} are left?", "-"),
]
MAX_OPERAND = 9  # addition: a, b in 1..9; subtraction: b in 1..9 and the result a - b in 1..9


def operands(operation: str, rng: random.Random, max_operand: int = MAX_OPERAND) -> tuple[int, int]:
    b = rng.randint(1, max_operand)
    if operation == "+":
        return rng.randint(1, max_operand), b
    return b + rng.randint(1, max_operand), b


def make_row(template: str, operation: str, name: str, obj: str, a: int, b: int) -> dict[str, str]:
    result = a + b if operation == "+" else a - b
    return {
        "prompt": template.format(name=name, obj=obj, a=a, b=b),
        "answer": str(result),
        "solution": f"{a} {operation} {b} = {result}. The answer is \\boxed{{{result}}}.",
    }


def draw(rng: random.Random, max_operand: int = MAX_OPERAND) -> dict[str, str]:
    template, operation = rng.choice(TEMPLATES)
    a, b = operands(operation, rng, max_operand)
    return make_row(template, operation, rng.choice(NAMES), rng.choice(OBJECTS), a, b)


def word_problems(
    num_train: int, num_eval: int, seed: int = 0, max_operand: int = MAX_OPERAND
) -> tuple[list[dict], list[dict]]:
    """(train rows, eval rows), seeded: eval prompts are distinct and none appears in train.
    Train rows are drawn with replacement (there are 4 · 8 · 8 · 81 = 20,736 distinct prompts)."""
    if num_train < 1 or num_eval < 1:
        raise ValueError(f"word_problems: need at least one train and one eval row, got {num_train}, {num_eval}")
    if max_operand < 1:
        raise ValueError(f"word_problems: max_operand must be >= 1, got {max_operand}")
    distinct = len(TEMPLATES) * len(NAMES) * len(OBJECTS) * max_operand**2
    if num_eval > distinct // 2:
        raise ValueError(
            f"word_problems: {num_eval} eval rows would leave too few of the {distinct} distinct prompts for training"
        )
    rng = random.Random(seed)
    eval_rows, held_out = [], set()
    while len(eval_rows) < num_eval:
        row = draw(rng, max_operand)
        if row["prompt"] not in held_out:
            held_out.add(row["prompt"])
            eval_rows.append(row)
    train_rows = []
    while len(train_rows) < num_train:
        row = draw(rng, max_operand)
        if row["prompt"] not in held_out:
            train_rows.append(row)
    return train_rows, eval_rows
