"""One policy, three digit tasks, three kinds of reward routed by domain, on a CPU:

  1. a Bradley–Terry reward model trained on `increment` pairs (configs/reward_model.yaml);
  2. a judge trained by SFT to compare a `decrement` response with the reference answer and reply
     "yes" or "no" (configs/sft.yaml);
  3. GRPO on all three tasks (configs/mixed_domains.yaml): `reverse` scored by the rule, `increment`
     by the reward model, `decrement` by the judge, after an SFT warm start on the noisy demonstrator.

Prints the reward model's held-out pair accuracy, the judge's held-out verdict accuracy, and for each
evaluation of the GRPO run, per domain, the held-out reward its own source gave and the exact-answer
accuracy of the same greedy answers (the truth the model and the judge stand in for). docs/rewards.md
holds the last table. Run it where configs/ and data/ are (the repository root):

    python examples/rewards/mixed_domains.py          # ~25 min on 2 CPU cores

Extra arguments go to every roll-train as overrides. Outputs: outputs/{rm_increment,judge_decrement,
grpo_mixed_domains} (replaced each time).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

SEED = 0
DOMAINS = {"=": "reverse", "+": "increment", "-": "decrement"}  # a prompt's last character names its task
HEADER_COMMAND = re.compile(r"^#\s+roll-train (.+)$")


def stages() -> dict[str, list[str]]:
    """The three commands of configs/mixed_domains.yaml's header, as roll-train arguments."""
    lines = Path("configs/mixed_domains.yaml").read_text().splitlines()
    commands = [m.group(1).split() for line in lines if (m := HEADER_COMMAND.match(line))]
    return dict(zip(["reward_model", "judge", "grpo"], commands, strict=True))


def run_name(arguments: list[str]) -> str:
    """The run a stage writes: its run_name= override, else its config's."""
    override = next((a.removeprefix("run_name=") for a in arguments if a.startswith("run_name=")), None)
    return override or yaml.safe_load(Path(arguments[1]).read_text())["run_name"]


def judge_accuracy(folder: str) -> float:
    """The judge's verdicts on its held-out rows (right and wrong decrement answers), against the truth."""
    from roll_lite.data.digit_domains import JUDGE_TEMPLATE, VERDICTS
    from roll_lite.rewards.judge import Judge

    rows = [json.loads(line) for line in Path("data/digit_domains/judge_eval.jsonl").read_text().splitlines()]
    judge = Judge(
        folder, template=JUDGE_TEMPLATE, parser="roll_lite.data.digit_domains:parse_verdict", max_new_tokens=4
    )
    try:
        outcomes = judge.score(
            [""] * len(rows), [r["judged"] for r in rows], [r["answer"] for r in rows], [{}] * len(rows)
        )
    finally:
        judge.close()
    truth = [row["response"] == VERDICTS[True] for row in rows]
    return sum(o.kind == "ok" and (o.value == 1.0) == right for o, right in zip(outcomes, truth)) / len(rows)


def per_domain(samples_file: Path) -> dict[str, tuple[float, float]]:
    """domain -> (mean held-out reward by its source, exact-answer accuracy) of one evaluation's answers."""
    found: dict[str, list[tuple[float, bool]]] = {}
    for line in samples_file.read_text().splitlines():
        sample = json.loads(line)
        domain = DOMAINS[sample["prompt"].strip()[-1]]
        found.setdefault(domain, []).append((sample["score"], sample["response"].strip() == sample["answer"]))
    return {
        domain: (sum(s for s, _ in values) / len(values), sum(r for _, r in values) / len(values))
        for domain, values in found.items()
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _, overrides = parser.parse_known_args(argv)
    seconds = {}
    for name, arguments in stages().items():
        run = run_name(arguments)
        shutil.rmtree(Path("outputs") / run, ignore_errors=True)
        command = [sys.executable, "-m", "roll_lite.cli", *arguments, f"seed={SEED}", *overrides]
        print(f"== {name}: roll-train {' '.join(command[3:])}", flush=True)
        start = time.monotonic()
        subprocess.run(command, check=True)
        seconds[name] = time.monotonic() - start
    rm = json.loads((Path("outputs/rm_increment/metrics.jsonl").read_text().splitlines())[-1])
    print(
        f"\nreward model (increment): held-out pair accuracy {rm['eval/rm/accuracy']:.3f} ({seconds['reward_model']:.0f} s)"
    )
    print(
        f"judge (decrement): held-out verdict accuracy {judge_accuracy('outputs/judge_decrement/final'):.3f} "
        f"({seconds['judge']:.0f} s)"
    )
    print(f"GRPO with its warm start: {seconds['grpo']:.0f} s\n")
    print(
        "| step | " + " | ".join(f"{d}: reward / exact" for d in DOMAINS.values()) + " |\n|---|" + "---|" * len(DOMAINS)
    )
    folder = Path("outputs/grpo_mixed_domains/eval_samples")
    for samples in sorted(folder.glob("step_*.jsonl"), key=lambda p: int(p.stem.removeprefix("step_"))):
        means = per_domain(samples)
        cells = [f"{means[d][0]:.3f} / {means[d][1]:.3f}" for d in DOMAINS.values()]
        print(f"| {samples.stem.removeprefix('step_')} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
