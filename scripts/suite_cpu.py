"""Where a command's CPU goes, by kind of process: every process on the machine sampled from /proc
while the command runs (the box should be otherwise idle), its CPU time summed by what it is.

    python scripts/suite_cpu.py [--save procs.json] -- python -m pytest -n 2 --dist loadfile -q
    python scripts/suite_cpu.py --load procs.json          # the table of an earlier sampling

A process is seen every --interval seconds; one that lives shorter than that is missed or counted short.
Kinds: the roll-train drivers, each Ray actor class (a Ray worker names itself ray::<Class> once it
holds an actor), Ray's own processes, vLLM's engine, the pytest processes, other Python processes by
their first arguments. CONTRIBUTING.md ("Where the time goes") has a table made with it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter

RAY_PROCESSES = (
    "gcs_server",
    "raylet",
    "dashboard/agent.py",
    "dashboard/dashboard.py",
    "log_monitor",
    "autoscaler/_private/monitor",
    "runtime_env/agent",
)


def kind(command: str, name: str) -> str:
    if "roll-train" in command or "roll_lite.cli" in command:
        return "roll-train driver"
    if "warm_driver.py" in command:  # tests/warm_driver.py: its zygote and the drivers forked from it
        return "roll-train driver, forked (and the zygotes)"
    if name.startswith("ray::"):
        return f"Ray actor {name.split('.')[0]}"
    if "default_worker.py" in command:
        return "Ray worker, no actor yet"
    for part in RAY_PROCESSES:
        if part in command:
            return f"Ray's {part}"
    if "pytest" in command or "exec(eval(sys.stdin.readline()))" in command:
        return "pytest processes"
    if "EngineCore" in name or "vllm" in command:
        return "vLLM engine"
    if not command:
        return "kernel threads"
    if "python" in command:
        return "python " + " ".join(command.split()[1:3])[:50]
    return name


def sample(stop: threading.Event, interval: float) -> dict[str, dict]:
    """{pid:start time: {command, name, CPU seconds since the first pass}} of every process seen until `stop`."""
    ticks, seen, first = os.sysconf("SC_CLK_TCK"), {}, True
    while not stop.is_set():
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                head, fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)
                fields = fields.split()
                key = f"{pid}:{fields[19]}"
                entry = seen.setdefault(key, {"command": ""})
                if not entry["command"]:
                    entry["command"] = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:200]
                entry["name"] = head.split("(", 1)[1]
                cpu = (int(fields[11]) + int(fields[12])) / ticks
                entry.setdefault("before", cpu if first else 0.0)  # spent before the command started
                entry["cpu"] = cpu - entry["before"]
            except (OSError, IndexError):
                continue  # gone meanwhile
        first = False
        stop.wait(interval)
    return seen


def table(seen: dict[str, dict], wall: float | None) -> str:
    cpu, count = Counter(), Counter()
    for entry in seen.values():
        k = kind(entry["command"], entry.get("name", ""))
        cpu[k] += entry.get("cpu", 0.0)
        count[k] += 1
    total = sum(cpu.values())
    lines = [f"CPU {total:.0f} s" + (f" in {wall:.0f} s wall ({total / wall:.2f} cores busy)" if wall else "")]
    lines += ["", "| processes | count | CPU s | share |", "|---|---:|---:|---:|"]
    lines += [f"| {k} | {count[k]} | {v:.0f} | {v / total:.1%} |" for k, v in cpu.most_common() if v >= 0.005 * total]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--save", help="write the sampled processes here (JSON)")
    parser.add_argument("--load", help="print the table of a saved sampling instead of running anything")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="after --: the command to run")
    args = parser.parse_args()
    if args.load:
        print(table(json.load(open(args.load)), None))
        return
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give a command after --, or --load FILE")
    stop, result = threading.Event(), {}
    sampler = threading.Thread(target=lambda: result.update(sample(stop, args.interval)))
    sampler.start()
    start = time.monotonic()
    returncode = subprocess.call(command)
    wall = time.monotonic() - start
    stop.set()
    sampler.join()
    if args.save:
        with open(args.save, "w") as out:
            json.dump(result, out)
    print(table(result, wall))
    sys.exit(returncode)


if __name__ == "__main__":
    main()
