"""The test suite's time per file, from tests/durations.json (or another file recorded the same way).

    python -m pytest -p no:xdist --record-durations tests/durations.json   # one process: times not shared with a peer
    python scripts/suite_timings.py [tests/durations.json] [--top N]

Prints a Markdown table: per file the tests, the seconds spent in setup (fixtures: models, engines,
Ray runs shared by a module) and in the tests' calls, slowest first; then the N slowest setups and calls.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def per_file(tests: dict[str, list[float]]) -> list[tuple[str, int, float, float]]:
    files: dict[str, list] = defaultdict(lambda: [0, 0.0, 0.0])
    for nodeid, (setup, call) in tests.items():
        row = files[nodeid.split("::")[0]]
        row[0] += 1
        row[1] += setup
        row[2] += call
    return sorted(((path, *row) for path, row in files.items()), key=lambda r: -(r[2] + r[3]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("durations", nargs="?", default=str(REPO / "tests" / "durations.json"))
    parser.add_argument("--top", type=int, default=10, help="also list the N slowest setups and calls")
    args = parser.parse_args()
    tests = json.loads(Path(args.durations).read_text())["tests"]
    rows = per_file(tests)
    print("| file | tests | setup s | call s | total s |\n|---|---:|---:|---:|---:|")
    for path, count, setup, call in rows:
        print(f"| {path} | {count} | {setup:.1f} | {call:.1f} | {setup + call:.1f} |")
    setup_all, call_all = sum(r[2] for r in rows), sum(r[3] for r in rows)
    print(f"| all | {sum(r[1] for r in rows)} | {setup_all:.1f} | {call_all:.1f} | {setup_all + call_all:.1f} |")
    if args.top:
        phases = [
            (times[i], phase, nodeid) for nodeid, times in tests.items() for i, phase in enumerate(("setup", "call"))
        ]
        print(f"\nThe {args.top} slowest setups and calls:\n")
        for seconds, phase, nodeid in sorted(phases, reverse=True)[: args.top]:
            print(f"- {seconds:.1f} s {phase}: {nodeid}")


if __name__ == "__main__":
    main()
