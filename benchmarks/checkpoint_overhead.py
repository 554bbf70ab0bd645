"""What checkpoints add to a step: the same tiny-model run through roll-train with a checkpoint after
every step and with checkpoints off, interleaved; the time of each save comes from the log
("checkpoint ... written in X s"), the step times from metrics.jsonl (perf/step_s, which excludes
the save).

    python benchmarks/checkpoint_overhead.py [--steps 10] [--repeats 2] [--large]

--large uses the demo's model size (~1 M parameters, configs/ppo.yaml) instead of the test-sized one.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_hidden_layers=2",
    "model.num_attention_heads=2",
    "model.num_key_value_heads=1",
]


def one_run(output: Path, name: str, steps: int, model: list[str], checkpoints: bool) -> dict:
    eval_file = output / "eval8.jsonl"
    eval_file.write_text("".join((REPO / "data/reverse_digits/eval.jsonl").read_text().splitlines(keepends=True)[:8]))
    args = [
        sys.executable,
        "-m",
        "roll_lite.cli",
        "--config",
        str(REPO / "configs/ppo.yaml"),
        *model,
        "sft.steps=0",
        f"steps={steps}",
        f"eval_every={steps}",
        "save_model=false",
        f"output_dir={output}",
        f"run_name={name}",
        f"data.eval_files={eval_file}",
        *(["checkpoint.every=1", "checkpoint.keep_last=1"] if checkpoints else ["checkpoint.enabled=false"]),
    ]
    start = time.perf_counter()
    result = subprocess.run(args, capture_output=True, text=True, cwd=REPO, check=True)
    wall = time.perf_counter() - start
    saves = [float(s) for s in re.findall(r"written in ([0-9.]+) s", result.stderr)]
    records = [json.loads(line) for line in (output / name / "metrics.jsonl").read_text().splitlines()][1:]
    size = (
        sum(p.stat().st_size for p in (output / name / "checkpoints").rglob("*") if p.is_file()) if checkpoints else 0
    )
    return {"steps": [r["perf/step_s"] for r in records], "saves": saves, "wall": wall, "bytes": size}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--large", action="store_true")
    args = parser.parse_args()
    model = [] if args.large else TINY
    runs = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for checkpoints in (True, False):  # interleaved: the box's load drifts
                name = f"{'ckpt' if checkpoints else 'plain'}{repeat}"
                runs[checkpoints].append(one_run(Path(tmp), name, args.steps, model, checkpoints))
    step_on = statistics.median(s for r in runs[True] for s in r["steps"][1:])  # the first step warms up
    step_off = statistics.median(s for r in runs[False] for s in r["steps"][1:])
    save = statistics.median(s for r in runs[True] for s in r["saves"])
    size = runs[True][0]["bytes"]  # keep_last=1: one checkpoint
    print(
        f"{'demo-size (~1 M params)' if args.large else 'test-size'} model, {args.steps} steps × {args.repeats} "
        f"repeats per setting, a checkpoint after every step\n"
    )
    print("| | median step s (perf/step_s) | median save s | save / step | step + save vs no checkpoints |")
    print("|---|---|---|---|---|")
    print(f"| checkpoints off | {step_off:.3f} | - | - | 1.00× |")
    print(
        f"| checkpoint every step | {step_on:.3f} | {save:.3f} | {save / step_on:.2f}× | {(step_on + save) / step_off:.2f}× |"
    )
    print(
        f"\ncheckpoint size on disk: about {size / 1e6:.1f} MB (actor + critic model and AdamW moments, reference "
        f"weights, RNG, metrics); wall per run: on {statistics.median(r['wall'] for r in runs[True]):.0f} s, "
        f"off {statistics.median(r['wall'] for r in runs[False]):.0f} s"
    )


if __name__ == "__main__":
    main()
