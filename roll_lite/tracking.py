"""The run directory: resolved config, metrics.jsonl, the held-out answers of each eval
(eval_samples/), PNG plots, and wandb (online/offline/disabled)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

logger = logging.getLogger(__name__)

PLOTTED = ("reward/mean", "eval/reward_mean", "sft/loss", "eval/sft_loss", "actor/kl", "actor/entropy", "actor/pg_loss", "actor/grad_norm",
           "actor/clipfrac", "perf/step_s")


class RunLogger:
    def __init__(self, run_dir: Path, config_yaml: str, wandb_mode: str, wandb_project: str, run_name: str):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(config_yaml)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.metrics_path.write_text("")
        self.history: list[dict] = []
        self.wandb_run = None
        if wandb_mode != "disabled":
            import wandb

            self.wandb_run = wandb.init(project=wandb_project, name=run_name, mode=wandb_mode, dir=str(self.run_dir))

    def log(self, step: int, metrics: dict[str, float], eval_samples: list[dict] | None = None) -> None:
        """A metrics.jsonl record; with `eval_samples` (one dict per held-out prompt: prompt,
        response, answer, score) also eval_samples/step_<step>.jsonl."""
        record = {"step": step, **{k: (v if math.isfinite(v) else None) for k, v in metrics.items()}}
        self.history.append(record)
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if eval_samples:
            folder = self.run_dir / "eval_samples"
            folder.mkdir(exist_ok=True)
            lines = "".join(json.dumps(sample, ensure_ascii=False) + "\n" for sample in eval_samples)
            (folder / f"step_{step}.jsonl").write_text(lines, encoding="utf-8")
        if self.wandb_run is not None:
            self.wandb_run.log(metrics, step=step)

    def finish(self) -> list[Path]:
        paths = self.write_plots()
        if self.wandb_run is not None:
            self.wandb_run.finish()
        return paths

    def write_plots(self) -> list[Path]:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        series = {name: [(r["step"], r[name]) for r in self.history if r.get(name) is not None] for name in PLOTTED}
        series = {name: points for name, points in series.items() if points}
        if not series:
            return []
        columns = 2
        rows = math.ceil(len(series) / columns)
        figure, axes = plt.subplots(rows, columns, figsize=(10, 3 * rows), squeeze=False)
        for axis, (name, points) in zip(axes.flat, series.items()):
            steps, values = zip(*points)
            axis.plot(steps, values, marker="o" if len(points) < 30 else None)
            axis.set_title(name)
            axis.set_xlabel("step")
        for axis in list(axes.flat)[len(series):]:
            axis.axis("off")
        figure.tight_layout()
        path = self.run_dir / "curves.png"
        figure.savefig(path, dpi=80)
        plt.close(figure)
        return [path]
