"""benchmarks/vs_trl.py's tables: step times, overlap, and the fair table: each arm's time to TRL's final
held-out reward, both sides treated alike.

Both sides evaluate the same held-out prompts by greedy decoding, scored by the same exact-answer rule, at
the same steps (--eval-every), and each evaluation carries the seconds since its process was launched
(roll_lite's perf/since_launch_s; TRL's side measures the same, from /proc/self/stat): start-up, evaluations
and every wait are in. Per round the target is TRL's final held-out reward of that round:
- first reached: the first evaluation at or above it (step, seconds since launch);
- stays: the first evaluation from which every later one is at or above it;
- wall: launch to exit, measured by the benchmark around each process.
Then per arm the median and the range over the rounds of each ratio to TRL's own time in the same round.
"""

from __future__ import annotations

import os
import statistics


def load_average() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def report(rows: list[dict], variants: list[str], args, skip: int, shape: dict) -> None:
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    print(f"\nload average at the end (1 / 5 / 15 min): {load_average()}")
    print(
        f"\n{args.steps} GRPO steps per run, {args.prompts} prompts × 8 completions, ≤ {args.max_new_tokens} new "
        f"tokens; torch threads: TRL "
        f"{args.trl_threads}, roll_lite's actor generating in its own process {args.in_actor_threads}, each worker "
        f"with a rollout worker {args.threads}; medians of steps {skip + 1}-{args.steps}\n"
    )
    print(
        "| run | round | median step s | generate s | train s | weight sync s | response tokens | "
        "held-out start → end | wall s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        tokens = "-" if r["response_tokens"] is None else f"{r['response_tokens']:.2f}"
        print(
            f"| {r['run']} | {r['round']} | {fmt(r['step_s'])} | {fmt(r['generate_s'])} | {fmt(r['train_s'])} | "
            f"{fmt(r['sync_s'])} | {tokens} | {r['held_out'][0]:.3f} → {r['held_out'][1]:.3f} | {r['wall_s']:.0f} |"
        )
    rounds = range(1, args.rounds + 1)
    step = {(r["variant"], r["round"]): r["step_s"] for r in rows}
    print(f"\n| run | median step s, rounds {' / '.join(map(str, rounds))} | / TRL per round | / TRL, geometric mean |")
    print("|---|---|---|---|")
    for variant in variants:
        label = next(r["run"] for r in rows if r["variant"] == variant)
        steps = " / ".join(f"{step[variant, k]:.3f}" for k in rounds)
        ratios = [step[variant, k] / step["trl", k] for k in rounds] if "trl" in variants else []
        per_round = " / ".join(f"{x:.2f}" for x in ratios) or "-"
        mean = f"{statistics.geometric_mean(ratios):.2f}" if ratios and variant != "trl" else "-"
        print(f"| {label} | {steps} | {per_round if variant != 'trl' else '-'} | {mean} |")

    overlap_table(rows, 8 * shape["prompts"])
    fair_table(rows, variants)


Evaluation = tuple[int, float, float]  # (step, seconds since launch, held-out reward)


def first_reached(evaluations: list[Evaluation], target: float) -> Evaluation | None:
    return next((e for e in evaluations if e[2] >= target), None)


def stays_at_or_above(evaluations: list[Evaluation], target: float) -> Evaluation | None:
    """The first evaluation from which every later one is >= target (None: the last is below it)."""
    stays = None
    for evaluation in evaluations:
        if evaluation[2] < target:
            stays = None
        elif stays is None:
            stays = evaluation
    return stays


def median_range(values: list[float]) -> str:
    if not values:
        return "not reached"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} [{min(values):.2f}–{max(values):.2f}]"


def fair_table(rows: list[dict], variants: list[str]) -> None:
    """rows: vs_trl.py's per-run dicts with `launched` (evaluations) and `wall_s`; TRL's runs as variant `trl`."""
    trl = {r["round"]: r for r in rows if r["variant"] == "trl"}
    if not trl:
        return
    print(
        "\n| run | round | start held-out | target (TRL's final) | first reached: step, s from launch | "
        "stays: step, s from launch | wall s |"
    )
    print("|---|---|---|---|---|---|---|")
    ratios: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        if r["round"] not in trl:
            continue
        base = trl[r["round"]]
        target = base["launched"][-1][2]
        first, stays = first_reached(r["launched"], target), stays_at_or_above(r["launched"], target)
        base_first = first_reached(base["launched"], target)
        base_stays = stays_at_or_above(base["launched"], target)
        start = r["launched"][0][2]
        same_start = "" if start == base["launched"][0][2] else " (≠ TRL's: the evaluators differ)"
        show = lambda e: "not reached" if e is None else f"{e[0]}, {e[1]:.1f}"  # noqa: E731
        print(
            f"| {r['run']} | {r['round']} | {start:.3f}{same_start} | {target:.3f} | {show(first)} | {show(stays)} | "
            f"{r['wall_s']:.1f} |"
        )
        arm = ratios.setdefault(r["variant"], {"first": [], "stays": [], "wall": [], "first_step": []})
        if first is not None and base_first is not None:
            arm["first"].append(first[1] / base_first[1])
            arm["first_step"].append(first[0])
        if stays is not None and base_stays is not None:
            arm["stays"].append(stays[1] / base_stays[1])
        arm["wall"].append(r["wall_s"] / base["wall_s"])
    print(
        "\n| run | first reached, step (median) | first reached, s from launch / TRL's | stays, / TRL's | "
        "wall, / TRL's |"
    )
    print("|---|---|---|---|---|")
    for variant in variants:
        arm = ratios.get(variant)
        if arm is None:
            continue
        label = next(r["run"] for r in rows if r["variant"] == variant)
        step = f"{statistics.median(arm['first_step']):g}" if arm["first_step"] else "not reached"
        print(
            f"| {label} | {step} | {median_range(arm['first'])} | {median_range(arm['stays'])} | "
            f"{median_range(arm['wall'])} |"
        )


def overlap_table(rows: list[dict], completions_per_step: int) -> None:
    """Per run: trajectories per second of step time, and the idle shares of trainer and engine."""
    share = lambda v: "-" if v is None else f"{100 * v:.0f} %"  # noqa: E731
    print("\n| run | round | trajectories / s | trainer idle | engine idle |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['run']} | {r['round']} | {completions_per_step / r['step_s']:.0f} | {share(r['trainer_idle'])} | "
            f"{share(r['engine_idle'])} |"
        )
