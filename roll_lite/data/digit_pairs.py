"""Preference pairs for the digit-reversal task, as JSONL files: a prompt, the right answer
(chosen) and a near miss (rejected), for the reward-model and DPO pipelines (configs/reward_model.yaml,
configs/dpo.yaml). The files they read (data/reverse_digits_pairs/{train,eval}.jsonl) are this module's
output, shipped in the repository. Regenerate them, byte for byte, with

    python -m roll_lite.data.digit_pairs data/reverse_digits_pairs

The prompts are those of data/reverse_digits (train pairs from its training rows, eval pairs from its
held-out rows, so held-out accuracy is measured on prompts never trained on). The near misses are
the mistakes a small model makes: the digits copied instead of reversed, one digit changed, two
neighbours swapped, one digit dropped or one added. `mistake` names which; each held-out prompt comes
with every kind.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from roll_lite.data.digits import reverse_digits_rows, write_jsonl

NUM_TRAIN, SEED = 4000, 0
MISTAKES = ("copied", "changed", "swapped", "dropped", "added")


def near_miss(answer: str, digits: str, mistake: str, rng: random.Random) -> str:
    """`answer` with one mistake of the kind named; may equal `answer` (a palindrome copied)."""
    i = rng.randrange(len(answer))
    if mistake == "copied":
        return digits
    if mistake == "changed":
        return answer[:i] + rng.choice([d for d in "0123456789" if d != answer[i]]) + answer[i + 1 :]
    if mistake == "swapped":
        i = min(i, len(answer) - 2)
        return answer[:i] + answer[i + 1] + answer[i] + answer[i + 2 :]
    if mistake == "dropped":
        return answer[:i] + answer[i + 1 :]
    return answer[:i] + rng.choice("0123456789") + answer[i:]


def pair_rows(rows: list[dict], rng: random.Random, every_mistake: bool = False) -> list[dict]:
    """A pair per row with a random mistake, or (`every_mistake`) one per row and kind of mistake."""
    pairs = []
    for row in rows:
        for kind in MISTAKES if every_mistake else [None]:
            for _ in range(100):  # a mistake that changes nothing (equal neighbours swapped) is drawn again
                mistake = kind or rng.choice(MISTAKES)
                rejected = near_miss(row["answer"], row["prompt"].rstrip("="), mistake, rng)
                if rejected != row["answer"]:
                    pairs.append(
                        {"prompt": row["prompt"], "chosen": row["answer"], "rejected": rejected, "mistake": mistake}
                    )
                    break
            # else: a palindrome has no 'copied' mistake, and it is left out
    return pairs


def digit_pair_rows(num_train: int = NUM_TRAIN, seed: int = SEED) -> tuple[list[dict], list[dict]]:
    """(train pairs, eval pairs): train from the first `num_train` training rows of the digit task,
    eval from all its held-out rows, each with every kind of mistake."""
    train_rows, eval_rows = reverse_digits_rows(seed=seed)
    rng = random.Random(f"pairs-{seed}")
    return pair_rows(train_rows[:num_train], rng), pair_rows(eval_rows, rng, every_mistake=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description="Write the digit-reversal preference pairs train.jsonl and eval.jsonl."
    )
    parser.add_argument("out_dir")
    parser.add_argument("--num-train", type=int, default=NUM_TRAIN)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train, evaluation = digit_pair_rows(args.num_train, args.seed)
    write_jsonl(train, out_dir / "train.jsonl")
    write_jsonl(evaluation, out_dir / "eval.jsonl")
    print("wrote", out_dir / "train.jsonl", out_dir / "eval.jsonl")


if __name__ == "__main__":
    main()
