"""From preference pairs to a policy, three routes on the digit-reversal task, on a CPU:

  0. SFT on the noisy demonstrator (configs/sft.yaml on `demonstration`): the start of every route;
  1. GRPO on the rule (exact answer), the reward the pairs were made with;
  2. a Bradley–Terry reward model trained on the pairs (configs/reward_model.yaml), then GRPO against
     it through the reward worker (reward.models), the rule never seen;
  3. DPO on the same pairs (configs/dpo.yaml).

Each route's final/ policy answers the 64 held-out prompts greedily (plain transformers), scored by
the rule; the reward model is scored on the held-out pairs. Prints one table (docs/preferences.md
holds the last one). Run it where configs/ and data/ are (the repository root):

    python examples/preferences/chain.py            # ~15 min on 2 CPU cores
    python examples/preferences/chain.py --smoke    # every stage for a step or two, tiny models

Extra arguments go to every roll-train as overrides. Outputs: outputs/chain_* (replaced each time).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

SEED = 0
TINY = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_hidden_layers=2",
    "model.num_attention_heads=2",
    "model.num_key_value_heads=1",
]
GRPO_STEPS, SFT_STEPS = 200, 1200  # as configs/grpo.yaml (its warm start); the reward model and DPO: their configs


def stages(smoke: bool) -> dict[str, list[str]]:
    """roll-train arguments of each stage, in order."""
    if smoke:
        sft, preference, grpo = (
            ["sft.steps=2"],
            ["preference.steps=2", "preference.eval_every=1"],
            ["steps=1", "eval_every=1"],
        )
    else:
        sft, preference, grpo = [f"sft.steps={SFT_STEPS}"], [], [f"steps={GRPO_STEPS}"]
    start = "model.pretrained_path=outputs/chain_sft/final"
    grpo_common = ["--config", "configs/grpo.yaml", start, "sft.steps=0", *grpo]
    return {
        "sft": [
            "--config",
            "configs/sft.yaml",
            "run_name=chain_sft",
            "sft.response_key=demonstration",
            "sft.eval_files=[]",
            *sft,
        ],
        "grpo_rule": [*grpo_common, "run_name=chain_grpo_rule"],
        "reward_model": ["--config", "configs/reward_model.yaml", "run_name=chain_rm", start, *preference],
        "grpo_rm": [
            *grpo_common,
            "run_name=chain_grpo_rm",
            "reward.models={outputs/chain_rm/final: 1.0}",
            "reward.functions={}",
        ],
        "dpo": ["--config", "configs/dpo.yaml", "run_name=chain_dpo", start, *preference],
    }


def held_out_accuracy(folder: Path) -> float:
    """Greedy answers of a causal LM folder to the 64 held-out prompts, scored by the rule (exact answer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = [json.loads(line) for line in Path("data/reverse_digits/eval.jsonl").read_text().splitlines()]
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder).eval()
    right = 0
    with torch.no_grad():
        for row in rows:
            ids = tokenizer(row["prompt"], return_tensors="pt")
            out = model.generate(**ids, max_new_tokens=10, do_sample=False)[0, ids["input_ids"].shape[1] :]
            right += tokenizer.decode(out, skip_special_tokens=True).strip() == row["answer"]
    return right / len(rows)


def last_metrics(run: str) -> dict:
    lines = (Path("outputs") / run / "metrics.jsonl").read_text().splitlines()
    return json.loads(lines[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="every stage for a step or two, tiny models")
    args, overrides = parser.parse_known_args(argv)
    overrides = ([*TINY, "workers.torch_threads=1"] if args.smoke else []) + [f"seed={SEED}", *overrides]
    seconds = {}
    for name, arguments in stages(args.smoke).items():
        run = next(a.removeprefix("run_name=") for a in arguments if a.startswith("run_name="))
        shutil.rmtree(Path("outputs") / run, ignore_errors=True)
        command = [sys.executable, "-m", "roll_lite.cli", *arguments, *overrides]
        print(f"== {name}: roll-train {' '.join(command[3:])}", flush=True)
        start = time.monotonic()
        subprocess.run(command, check=True)
        seconds[name] = time.monotonic() - start
    rm = last_metrics("chain_rm")
    rows = [
        ("SFT on the demonstrator (the start)", "chain_sft", seconds["sft"]),
        ("GRPO on the rule", "chain_grpo_rule", seconds["grpo_rule"]),
        ("reward model, then GRPO against it", "chain_grpo_rm", seconds["reward_model"] + seconds["grpo_rm"]),
        ("DPO on the pairs", "chain_dpo", seconds["dpo"]),
    ]
    print(
        f"\nreward model: held-out pair accuracy {rm['eval/rm/accuracy']:.3f}, score gap {rm['eval/rm/score_gap']:.3f}"
    )
    print("\n| route | held-out reward (rule, greedy) | wall time after SFT |\n|---|---|---|")
    for label, run, wall in rows:
        accuracy = held_out_accuracy(Path("outputs") / run / "final")
        print(f"| {label} | {accuracy:.3f} | {'—' if run == 'chain_sft' else f'{wall:.0f} s'} |")


if __name__ == "__main__":
    main()
