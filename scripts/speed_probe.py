"""How fast is this box today? The tiny 6-step roll-train run (tests/test_resume.py's shapes) in a cpuacct cgroup
of its own: its CPU seconds, every process it starts included (the driver, Ray's processes, the model worker).

    python scripts/speed_probe.py [--rounds 3] [--override KEY=VALUE ...] [--processes]

`--override` (repeatable) adds a key=value to the probe's command, e.g. `--override workers.backend=local`
(every worker in roll-train's process, no Ray). Besides the CPU seconds and the wall time it reports the
time from the launch to the first step's log line (`step 1/6 |`): the start-up a user waits through.
`--processes` adds where the CPU went: each process of the cgroup sampled from /proc every 50 ms and summed
by kind (scripts/suite_cpu.py's kinds), over the rounds; what the sampling missed (the last 50 ms of each
process, and the short-lived ones) shows as "not sampled".

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
import threading
import time
from collections import Counter
from pathlib import Path

from cpu_cgroup import CpuCgroup
from suite_cpu import kind

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


def sample_group(group: CpuCgroup, stop: threading.Event, kinds: Counter) -> None:
    """Puts in `kinds` the CPU seconds of every process seen in `group` until `stop`, by kind."""
    ticks, seen = os.sysconf("SC_CLK_TCK"), {}  # pid:start time -> [command, name, CPU s]
    while not stop.wait(0.05):
        for pid in (group.path / "cgroup.procs").read_text().split():  # type: ignore[operator]
            try:
                head, tail = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)
                fields = tail.split()
                entry = seen.setdefault(f"{pid}:{fields[19]}", ["", "", 0.0])
                # read again each time: a child's first look can be between its fork and its exec
                entry[0] = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")[:200] or entry[0]
                entry[1] = head.split("(", 1)[1]  # Ray's workers rename themselves (ray::IDLE, ray::<Class>)
                entry[2] = (int(fields[11]) + int(fields[12])) / ticks
            except (OSError, IndexError):
                continue  # gone meanwhile
    for command, name, cpu in seen.values():
        kinds[kind(command, name)] += cpu


def run_once(overrides: list[str], kinds: Counter | None = None) -> tuple[float | None, float, float]:
    """(CPU s or None where no cgroup can be made, wall s, s to the first step's log line) of one probe run;
    with `kinds`, adds its processes' CPU seconds to it by kind."""
    with tempfile.TemporaryDirectory() as tmp, CpuCgroup("speed_probe") as group:
        stop, sampled = threading.Event(), Counter()
        sampler = threading.Thread(target=sample_group, args=(group, stop, sampled))
        if kinds is not None and group.path is not None:
            sampler.start()
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
        cpu = group.seconds()
        if kinds is not None and sampler.is_alive():
            stop.set()
            sampler.join()
            kinds.update(sampled)
            kinds["not sampled"] += (cpu or 0.0) - sum(sampled.values())
        return cpu, wall, first_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--override", action="append", default=[], metavar="KEY=VALUE", help="added to the probe's command"
    )
    parser.add_argument("--processes", action="store_true", help="also the CPU seconds of each kind of process")
    args = parser.parse_args()
    if bad := [item for item in args.override if "=" not in item]:
        parser.error(f"--override takes KEY=VALUE, got {bad[0]!r}")
    kinds: Counter | None = Counter() if args.processes else None
    runs = [run_once(args.override, kinds) for _ in range(args.rounds)]
    cpus = [cpu for cpu, _, _ in runs if cpu is not None]
    print(f"| probe{' ' + ' '.join(args.override) if args.override else ''} | median | min | max |")
    print("|---|---:|---:|---:|")
    if cpus:
        print(f"| CPU s | {statistics.median(cpus):.1f} | {min(cpus):.1f} | {max(cpus):.1f} |")
    for name, values in (("wall s", [run[1] for run in runs]), ("s to step 1", [run[2] for run in runs])):
        print(f"| {name} | {statistics.median(values):.1f} | {min(values):.1f} | {max(values):.1f} |")
    if kinds:
        print(f"\n| processes | CPU s per round (mean of {args.rounds}) |\n|---|---:|")
        print("\n".join(f"| {name} | {cpu / args.rounds:.2f} |" for name, cpu in kinds.most_common()))


if __name__ == "__main__":
    main()
