"""How fast is this box today? The tiny 6-step roll-train run (tests/test_resume.py's shapes) in a cpuacct cgroup
of its own: its CPU seconds, every process it starts included (the driver, Ray's processes, the model worker).

    python scripts/speed_probe.py [--rounds 3] [--override KEY=VALUE ...]

`--override` (repeatable) adds a key=value to the probe's command, e.g. `--override workers.backend=local`
(every worker in roll-train's process, no Ray). Besides the CPU seconds and the wall time it reports the
time from the launch to the first step's log line (`step 1/6 |`): the start-up a user waits through.

On the 2-core Intel Xeon box this took 10.1-11.9 s of CPU on a fast day and up to 24 s on a slow one
(CONTRIBUTING.md, "The CI budget"). Report it beside every suite measurement, so that a slow day shows as one.
Needs root and cgroup v1's cpuacct controller; without them it reports wall time only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cpu_cgroup import CpuCgroup

REPO = Path(__file__).resolve().parents[1]
FIRST_STEP = " step 1/6 |"  # the first step's log line
TINY = [  # tests/test_resume.py's TINY, 6 steps
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_hidden_layers=2",
    "model.num_attention_heads=2",
    "model.num_key_value_heads=1",
    "sft.steps=0",
    "workers.torch_threads=1",
    "reward.functions={token_accuracy: 1.0}",
    "rollout.prompts_per_step=2",
    "rollout.num_samples=4",
    "steps=6",
    "eval_every=2",
    "checkpoint.every=2",
    "checkpoint.keep_last=null",
    "save_model=false",
]


def probe_command(folder: Path, overrides: list[str]) -> list[str]:
    for name in ("train", "eval"):
        lines = (REPO / f"data/reverse_digits/{name}.jsonl").read_text().splitlines(keepends=True)[:8]
        (folder / f"{name}.jsonl").write_text("".join(lines))
    return [
        sys.executable,
        "-m",
        "roll_lite.cli",
        "--config",
        str(REPO / "configs/ppo.yaml"),
        *TINY,
        f"data.train_files={folder / 'train.jsonl'}",
        f"data.eval_files={folder / 'eval.jsonl'}",
        f"output_dir={folder / 'out'}",
        "run_name=probe",
        *overrides,
    ]


def run_once(overrides: list[str]) -> tuple[float | None, float, float]:
    """(CPU s or None where no cgroup can be made, wall s, s to the first step's log line) of one probe run."""
    with tempfile.TemporaryDirectory() as tmp, CpuCgroup("speed_probe") as group:
        command = probe_command(Path(tmp), overrides)
        start = time.monotonic()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled"}
        process = subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=group.join,
        )
        assert process.stdout is not None  # stdout=PIPE
        output, first_step = [], None
        for line in process.stdout:  # the log, as it comes: the first step's line is timed on arrival
            output.append(line)
            if first_step is None and FIRST_STEP in line:
                first_step = time.monotonic() - start
        returncode = process.wait(timeout=600)
        wall = time.monotonic() - start
        if returncode != 0 or first_step is None:
            raise SystemExit(f"speed_probe: the probe run failed ({returncode}):\n{''.join(output)[-2000:]}")
        return group.seconds(), wall, first_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--override", action="append", default=[], metavar="KEY=VALUE", help="added to the probe's command"
    )
    args = parser.parse_args()
    if bad := [item for item in args.override if "=" not in item]:
        parser.error(f"--override takes KEY=VALUE, got {bad[0]!r}")
    runs = [run_once(args.override) for _ in range(args.rounds)]
    cpus = [cpu for cpu, _, _ in runs if cpu is not None]
    print(f"| probe{' ' + ' '.join(args.override) if args.override else ''} | median | min | max |")
    print("|---|---:|---:|---:|")
    if cpus:
        print(f"| CPU s | {statistics.median(cpus):.1f} | {min(cpus):.1f} | {max(cpus):.1f} |")
    for name, values in (("wall s", [run[1] for run in runs]), ("s to step 1", [run[2] for run in runs])):
        print(f"| {name} | {statistics.median(values):.1f} | {min(values):.1f} | {max(values):.1f} |")


if __name__ == "__main__":
    main()
