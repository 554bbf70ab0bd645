"""The run directory: resolved config, metrics.jsonl, the held-out answers of each eval
(eval_samples/), curves.svg (runtime/curves.py), and wandb (online/offline/disabled)."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import secrets
from pathlib import Path

logger = logging.getLogger(__name__)

PLOTTED = (
    "reward/mean",
    "eval/reward_mean",
    "sft/loss",
    "eval/sft_loss",
    "actor/kl",
    "actor/entropy",
    "actor/pg_loss",
    "actor/grad_norm",
    "actor/clipfrac",
    "perf/step_s",
    # multi-turn runs (pipelines/multi_turn.py)
    "env/turns",
    "env/terminated",
    "eval/terminated",
    "env/truncated",
    "eval/turns_to_terminate",
    "env/env_s",
)
# one chart each: the engine / trainer mismatch per source (pipelines/mismatch.py), an MoE policy's expert load
# per layer (pipelines/moe_routing.py)
PLOTTED_PATTERN = re.compile(r"rollout/mismatch/[^/]+/(logp_gap_p99|ratio_out_of_band)|moe/load/layer\d+/max")


def since_launch_s() -> float:
    """Seconds since this process started: the wall time from launch (roll-train's own start, imports
    included) that a record was written at (Linux: the start time in /proc/self/stat, in clock ticks since boot)."""
    start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    return uptime_s - start_ticks / os.sysconf("SC_CLK_TCK")


WANDB_ID_FILE = "wandb_run_id"  # in the run directory: the wandb run a resumed run continues


class RunLogger:
    def __init__(
        self,
        run_dir: Path,
        config_yaml: str,
        wandb_mode: str,
        wandb_project: str,
        run_name: str,
        history: list[dict] | None = None,
    ):
        """`history`: the records of a resumed run up to its checkpoint; metrics.jsonl is rewritten
        with them (dropping records logged after the checkpoint) and continued, and so is the run
        directory's wandb run."""
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(config_yaml)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        logged_before = _last_step(self.metrics_path) if history is not None else None
        self.history: list[dict] = list(history or [])
        dropped = rewrite_metrics(self.metrics_path, self.history)
        if dropped:
            checkpoint_step = self.history[-1]["step"] if self.history else 0
            logger.info(
                "resume: dropped the records of %s that the previous run logged after checkpoint step_%d",
                step_span(dropped),
                checkpoint_step,
            )
        self.wandb_run = None
        self.wandb_from_step = 0  # wandb gets the steps from this one on (a resumed run: the steps it has not seen)
        if wandb_mode != "disabled":
            self.wandb_run = self._start_wandb(wandb_mode, wandb_project, run_name, logged_before)

    def _start_wandb(self, mode: str, project: str, run_name: str, logged_before: int | None):
        """A fresh run gets a new wandb run, its id kept in the run directory; a resumed run continues
        that wandb run (resume="allow"; offline, a new segment with the same id, which `wandb sync`
        puts after the first). wandb cannot take back steps it has (rewinding a run is a private
        preview), so the steps the killed run logged after its checkpoint are not sent again: wandb
        keeps those first values, metrics.jsonl has the resumed run's."""
        import wandb

        id_file = self.run_dir / WANDB_ID_FILE
        resumed = logged_before is not None and id_file.is_file()
        if resumed:
            run_id = id_file.read_text().strip()
        else:
            run_id = secrets.token_hex(6)  # wandb run ids: letters, digits, - and _
            temporary = id_file.with_name(f".{WANDB_ID_FILE}.tmp")
            temporary.write_text(run_id + "\n")
            temporary.replace(id_file)
        run = wandb.init(
            project=project,
            name=run_name,
            mode=mode,
            dir=str(self.run_dir),
            id=run_id,
            resume="allow" if resumed else None,
        )
        if resumed:
            self.wandb_from_step = max(logged_before, run.step - 1) + 1  # run.step: the next step wandb expects
            checkpoint_step = self.history[-1]["step"] if self.history else -1
            redone = (
                f"; steps {checkpoint_step + 1}-{self.wandb_from_step - 1}, logged by the run before it "
                "stopped, are not sent again (wandb keeps the first values; metrics.jsonl has this run's)"
                if self.wandb_from_step > checkpoint_step + 1
                else ""
            )
            logger.info("wandb: continuing run %s from step %d%s", run_id, self.wandb_from_step, redone)
        return run

    def log(self, step: int, metrics: dict[str, float], eval_samples: list[dict] | None = None) -> None:
        """A metrics.jsonl record; with `eval_samples` (one dict per held-out prompt: prompt,
        response, answer, score) also eval_samples/step_<step>.jsonl."""
        metrics = {**metrics, "perf/since_launch_s": round(since_launch_s(), 3)}
        record = {"step": step, **{k: (v if math.isfinite(v) else None) for k, v in metrics.items()}}
        self.history.append(record)
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if eval_samples:
            folder = self.run_dir / "eval_samples"
            folder.mkdir(exist_ok=True)
            lines = "".join(json.dumps(sample, ensure_ascii=False) + "\n" for sample in eval_samples)
            (folder / f"step_{step}.jsonl").write_text(lines, encoding="utf-8")
        if self.wandb_run is not None and step >= self.wandb_from_step:
            self.wandb_run.log(metrics, step=step)

    def log_table(self, step: int, key: str, columns: dict[str, list]) -> None:
        """A wandb table of `step` (the step's traced samples, roll_lite/runtime/traces.py); none without wandb."""
        if self.wandb_run is None or step < self.wandb_from_step:
            return
        import wandb

        names = list(columns)
        rows = [list(row) for row in zip(*columns.values())]
        self.wandb_run.log({key: wandb.Table(columns=names, data=rows)}, step=step)

    def finish(self) -> list[Path]:
        paths = self.write_plots()
        if self.wandb_run is not None:
            self.wandb_run.finish()
        return paths

    def write_plots(self) -> list[Path]:
        from roll_lite.runtime.curves import write_curves

        matched = {name: None for r in self.history for name in r if PLOTTED_PATTERN.fullmatch(name)}
        names = [*PLOTTED, *matched]
        series = {name: [(r["step"], r[name]) for r in self.history if r.get(name) is not None] for name in names}
        path = write_curves(self.run_dir / "curves.svg", series)
        return [] if path is None else [path]


def rewrite_metrics(metrics_path: Path, history: list[dict]) -> list[int]:
    """metrics.jsonl holds `history` (a resumed run: the checkpoint's records) and nothing else;
    returns the steps of the records it held beyond them (logged after the checkpoint), ascending."""
    last_kept = history[-1]["step"] if history else -1
    dropped = sorted(step for step in _steps(metrics_path) if step > last_kept)
    temporary = metrics_path.with_name(".metrics.jsonl.tmp")
    temporary.write_text("".join(json.dumps(record) + "\n" for record in history))
    temporary.replace(metrics_path)
    return dropped


def step_span(steps: list[int]) -> str:
    """'step 7', 'steps 51-57' (consecutive), else 'steps 3, 5, 8'."""
    if len(steps) == 1:
        return f"step {steps[0]}"
    if steps == list(range(steps[0], steps[-1] + 1)):
        return f"steps {steps[0]}-{steps[-1]}"
    return "steps " + ", ".join(map(str, steps))


def _last_step(metrics_path: Path) -> int:
    """The highest step metrics.jsonl holds (-1: none): what a stopped run logged, checkpoint or not."""
    return max(_steps(metrics_path), default=-1)


def _steps(metrics_path: Path) -> list[int]:
    """The step of each record in metrics.jsonl (none when there is no file)."""
    if not metrics_path.is_file():
        return []
    steps = []
    for line in metrics_path.read_text().splitlines():
        try:
            steps.append(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):  # a line cut short by the kill
            continue
    return steps
