"""Three digit tasks, each its own domain, for a run whose rewards are routed by domain
(configs/mixed_domains.yaml, docs/rewards.md#a-mixed-domain-run-on-a-cpu):

- `reverse`:   "38125=" -> "52183", scored by a rule (exact_answer);
- `increment`: "38125+" -> "49236" (each digit + 1, 9 -> 0), scored by a reward model trained here
  on preference pairs (configs/reward_model.yaml on `increment_pairs_*.jsonl`);
- `decrement`: "38125-" -> "27014" (each digit - 1, 0 -> 9), scored by a judge trained here to
  compare a response with the reference answer (configs/sft.yaml on `judge_*.jsonl`), both read
  through JUDGE_TEMPLATE.

Training rows carry the noisy demonstrator's response (`demonstration`: the right answer 30 % of the
time, else the digits copied), as the demo's do. Held-out prompts never appear in training, in any
domain. The judge's rows are its template filled in (JUDGE_TEMPLATE, the config's
reward.judge_template) and the verdict it should reply; their responses are right or near misses in
equal shares. The files are this module's output, shipped in the repository. Regenerate them, byte
for byte, with

    python -m roll_lite.data.digit_domains data/digit_domains
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from roll_lite.data.digit_pairs import MISTAKES, near_miss
from roll_lite.data.digits import CORRECT_FRACTION, noisy_demonstration, write_jsonl

TASKS = {
    "reverse": ("=", lambda digits: digits[::-1]),
    "increment": ("+", lambda digits: "".join(str((int(d) + 1) % 10) for d in digits)),
    "decrement": ("-", lambda digits: "".join(str((int(d) - 1) % 10) for d in digits)),
}
# The judge reads the answer and the response interleaved, digit by digit, each pair closed by a comma
# ("012" against "013": "00,11,23,?"; a missing digit "_", extra digits after the pairs): a ~1 M-parameter
# judge learns to compare neighbours, where it stayed at chance on "013:012?" (lining up positions
# across two strings of 3-7 digits) and reached 0.87 without the commas (finding which digits pair up).
JUDGE_TEMPLATE = (
    "{% for i in range(answer|length) %}{{ answer[i] }}{{ response[i] if i < response|length else '_' }},"
    "{% endfor %}{{ response[answer|length:] }}?"
)
# The judge's reply: one word and its EOS, so that judging a response costs 2 generated tokens, not the
# 18 of "Verdict: incorrect" (the judge was as accurate with either: 0.87 on its held-out rows)
VERDICTS = {True: "yes", False: "no"}


def parse_verdict(reply: str) -> float | None:
    """reward.judge_parser for this judge: 1 for "yes", 0 for "no", None (unparseable) for anything else."""
    word = reply.strip().lower()
    return {"yes": 1.0, "no": 0.0}.get(word)


NUM_TRAIN, NUM_EVAL, NUM_PAIRS, NUM_JUDGE, MIN_DIGITS, MAX_DIGITS, SEED = 4000, 32, 4000, 12000, 3, 7, 0


def make_row(digits: str, domain: str) -> dict[str, str]:
    operator, solve = TASKS[domain]
    return {"prompt": digits + operator, "answer": solve(digits), "domain": domain}


def _draw(rng: random.Random, domain: str) -> dict[str, str]:
    length = rng.randint(MIN_DIGITS, MAX_DIGITS)
    return make_row("".join(rng.choice("0123456789") for _ in range(length)), domain)


def domain_rows(
    num_train: int = NUM_TRAIN, num_eval: int = NUM_EVAL, seed: int = SEED
) -> tuple[list[dict], list[dict]]:
    """(train rows, eval rows), each domain in turn; eval prompts are distinct and never in train."""
    train: list[dict] = []
    evaluation: list[dict] = []
    for domain in TASKS:
        eval_rng, held_out = random.Random(f"eval-{domain}-{seed}"), dict[str, dict]()
        while len(held_out) < num_eval:
            row = _draw(eval_rng, domain)
            held_out.setdefault(row["prompt"], row)
        train_rng, demonstrator = random.Random(f"train-{domain}-{seed}"), random.Random(f"demo-{domain}-{seed}")
        rows: list[dict] = []
        while len(rows) < num_train:
            row = _draw(train_rng, domain)
            if row["prompt"] not in held_out:
                row["demonstration"] = noisy_demonstration(
                    row["prompt"][:-1], row["answer"], CORRECT_FRACTION, demonstrator
                )
                rows.append(row)
        train += rows
        evaluation += held_out.values()
    return train, evaluation


def wrong_answer(row: dict, rng: random.Random) -> str:
    """A near miss of the row's answer (digit_pairs' mistakes), never the answer itself."""
    while True:
        wrong = near_miss(row["answer"], row["prompt"][:-1], rng.choice(MISTAKES), rng)
        if wrong != row["answer"]:
            return wrong


def increment_pairs(rows: list[dict], rng: random.Random) -> list[dict]:
    return [{"prompt": r["prompt"], "chosen": r["answer"], "rejected": wrong_answer(r, rng)} for r in rows]


def judge_rows(rows: list[dict], rng: random.Random) -> list[dict]:
    """The judge's SFT rows: the template filled with a right or a wrong response (`prompt`), the
    verdict (`response`), and what was judged (`judged`, `answer`)."""
    import jinja2

    template = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(JUDGE_TEMPLATE)
    judged = []
    for row in rows:
        right = rng.random() < 0.5
        response = row["answer"] if right else wrong_answer(row, rng)
        judged.append(
            {
                "prompt": template.render(response=response, answer=row["answer"], prompt=row["prompt"], extra={}),
                "response": VERDICTS[right],
                "judged": response,
                "answer": row["answer"],
            }
        )
    return judged


def write_digit_domains(out_dir: str | Path, seed: int = SEED) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train, evaluation = domain_rows(seed=seed)
    by_domain = {domain: [r for r in train if r["domain"] == domain] for domain in TASKS}
    held_out = {domain: [r for r in evaluation if r["domain"] == domain] for domain in TASKS}
    rng = random.Random(f"sources-{seed}")
    files = {
        "train.jsonl": train,
        "eval.jsonl": evaluation,
        # the reward model learns from training prompts; its held-out pairs come from held-out prompts
        "increment_pairs_train.jsonl": increment_pairs(by_domain["increment"][:NUM_PAIRS], rng),
        "increment_pairs_eval.jsonl": increment_pairs(held_out["increment"] * 4, rng),
        "judge_train.jsonl": judge_rows((by_domain["decrement"] * 3)[:NUM_JUDGE], rng),  # each prompt thrice
        "judge_eval.jsonl": judge_rows(held_out["decrement"] * 4, rng),
    }
    for name, rows in files.items():
        write_jsonl(rows, out_dir / name)
    return [out_dir / name for name in files]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Write the three-domain digit task and its reward sources' data.")
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    for path in write_digit_domains(args.out_dir, args.seed):
        print("wrote", path)


if __name__ == "__main__":
    main()
