"""Checkpointer: when to save, and the atomic write of one checkpoint (roll_lite/checkpoint/layout.py)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Sequence

from roll_lite.checkpoint import layout
from roll_lite.checkpoint.pipeline_state import save_pipeline_state

logger = logging.getLogger("roll_lite")
# Tests only: at this step, wait 10 minutes after the parts are written, before the commit (a window to kill in).
PAUSE_BEFORE_COMMIT = "ROLL_LITE_TEST_PAUSE_BEFORE_COMMIT_AT_STEP"


class Checkpointer:
    def __init__(self, run_dir: Path, config, config_yaml: str, pipeline, tracker, config_history: Sequence[dict] = ()):
        """`config_history`: the config changes of the resumes that led here (config_changes.py), kept in
        each checkpoint.json."""
        self.run_dir, self.config, self.config_yaml = Path(run_dir), config, config_yaml
        self.config_history = list(config_history)
        self.pipeline, self.tracker = pipeline, tracker
        self.last_saved: int | None = None
        self.seconds: list[float] = []  # how long each save took

    def due(self, step: int, last: bool) -> bool:
        """Every `checkpoint.every` steps and after the last one."""
        c = self.config
        return c.enabled and step != self.last_saved and (last or (c.every > 0 and step % c.every == 0))

    def maybe_save(self, step: int, last: bool = False) -> Path | None:
        return self.save(step) if self.due(step, last) else None

    def save(self, step: int) -> Path:
        """Write step `step`'s checkpoint into a temporary folder, then commit it (rename, `latest`)."""
        start = time.perf_counter()
        layout.remove_partials(self.run_dir)
        partial, target = layout.partial_dir(self.run_dir, step), layout.step_dir(self.run_dir, step)
        partial.mkdir(parents=True)
        manifest = save_pipeline_state(self.pipeline, partial, step)
        if self.config_history:
            manifest["config_changes"] = self.config_history
        (partial / "config.yaml").write_text(self.config_yaml)
        shutil.copyfile(self.tracker.metrics_path, partial / "metrics.jsonl")
        if os.environ.get(PAUSE_BEFORE_COMMIT) == str(step):
            logger.info("checkpoint step_%d: parts written, pausing before the commit (test)", step)
            time.sleep(600)
        (partial / layout.MARKER).write_text(json.dumps(manifest, indent=1))
        layout.commit(partial, target)
        pruned = layout.prune(self.run_dir, self.config.keep_last)
        self.last_saved = step
        self.seconds.append(time.perf_counter() - start)
        logger.info(
            "checkpoint %s written in %.3f s%s",
            target,
            self.seconds[-1],
            f" (removed step {', '.join(map(str, pruned))})" if pruned else "",
        )
        return target
